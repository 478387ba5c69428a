"""Rewards: rubric data and formats, aggregators, rewarders, bundling, incentive analysis."""
