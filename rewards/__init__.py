"""Rewards: rubric data and formats, aggregators, rewarders, bundling, incentive analysis."""

# The ProRubric authors' row formats register themselves into rewards.rubric's registries
# (RUBRIC_FORMATS, RUBRIC_WRITERS, PARQUET_TABLES) on import; importing the package does it, so
# load_rubrics / save_rubrics know them whichever rewards module is imported first.
from rewards import rubric_formats as _rubric_formats  # noqa: F401
