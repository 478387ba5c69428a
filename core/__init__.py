"""Shared pieces every layer uses and none owns: the name registry, the value types that flow
through the loop (prompts, trajectories, groups, reward outputs) and the group predicates.

A leaf: it imports no other package of this project, so models, judges, rewards, memory and
rl can all depend on it without pointing upward.
"""
