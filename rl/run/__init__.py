"""A training run around the GRPO step: its config, wiring, data, loop state and host loop,
checkpoints and resume, the run folder and its logs, provenance, multi-host exchange, LoRA
state, compile cache and evaluation."""
