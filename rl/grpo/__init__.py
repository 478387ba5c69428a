"""GRPO and DAPO as pure functions: advantages, KL, policy losses, DAPO's sampling and shaping,
group statistics, the reward stage, the batch layout, consistency filtering, off-policy
bookkeeping, the optimizer and the jitted train step."""
