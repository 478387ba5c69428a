"""Built-in tasks: ``arith`` (verifiable arithmetic) and ``rubric_chat`` (rubric-graded chat).
Config names select them through ``rl.run.wiring``."""
