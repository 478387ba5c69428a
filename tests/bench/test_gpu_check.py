"""bench/gpu_check.sh, the accelerator check of README "Benchmarks", as a CPU dry run: the
same script and commands (bench.sampling_check, bench.accelerator, its decode with shared
prompts, bench.scoring_precision, bench.random_model, rl.train with the accelerator settings)
on the tiny shape, each part ending with exit 0."""

import json
import os
import subprocess
import sys

from tests.paths import ROOT


def test_the_gpu_check_runs_end_to_end_on_a_cpu(tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHON=sys.executable, SHAPES="tiny",
               ONLY="^(sampling_check|accelerator|decode_shared_prompts|scoring_precision|train)$",
               ACCEL_ARGS="--shapes tiny --batch 8 --group 4 --prompt-len 16 --new-tokens 16 "
                          "--repeats 1",
               SAMPLING_ARGS="--vocab 4096 --grid-bits 16 --chunk 4096",
               PRECISION_ARGS="--batch 2 --prompt-len 8 --new-tokens 8",
               TRAIN_ARGS="trainer.batch_prompts=2 algo.group_size=2 trainer.max_new_tokens=8 "
                          "trainer.logits_chunk=4")
    out = tmp_path / "check"
    res = subprocess.run(["bash", "bench/gpu_check.sh", str(out)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for part in ("sampling_check", "accelerator", "decode_shared_prompts", "scoring_precision",
                 "train"):
        assert f"== {part}: exit 0" in res.stdout, res.stdout[-3000:]
    assert "HIGHEST max error" in (out / "sampling_check.log").read_text()
    row, shared = map(json.loads, (out / "accelerator.jsonl").read_text().splitlines())
    assert row["shapes"] == "tiny" and row["decode_tok_s"] > 0 and row["update_s"] > 0
    # prompts shared by groups of 4: a step must read less of the cache (a quarter of the
    # 16 prompt slots a row instead of all 16)
    assert shared["shared_prompts"] and shared["decode_tok_s"] > 0
    assert shared["decode_step_gb"] < row["decode_step_gb"]
    # a CPU computes float32 dots float32-true at any precision: the three settings agree, and
    # the sampler's log-probs are the scoring pass's to float32 rounding
    precision = json.loads((out / "scoring_precision.jsonl").read_text())
    for setting in ("default", "ours", "highest"):
        assert precision[setting]["score_ref_max"] == 0.0
        assert precision[setting]["sampler_score_max"] < 1e-5
    steps = [json.loads(x) for x in (out / "train_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps] == [0, 1, 2] and all(r["time/reference_s"] > 0
                                                           for r in steps)
    assert not (out / "tiny_random").exists()  # the random model is removed at the end
