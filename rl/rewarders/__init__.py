"""The rewarders the loop calls: the verifiable outcome, ARBOR's rubric memory (and its RaR
ablation), and the rubric aggregators. ``rl.run.wiring`` names each."""
