"""``rl.smoke``'s checks that need no second process: the evaluation run once, the step
planned on the job's own devices, memory against the plan (the 2-process smoke is in
tests/rl/run/test_multihost.py)."""

from types import SimpleNamespace

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from rl.plan import CHIPS, GPUS, device_chip
from rl.smoke import memory_verdict, report, smoke
from tests.paths import CONF

GiB = 2**30


def _device(platform, kind, stats=None):
    return SimpleNamespace(platform=platform, device_kind=kind, memory_stats=lambda: stats)


def test_the_chip_of_a_jobs_devices_is_read_from_their_kind_and_limit():
    v5e = device_chip([_device("tpu", "TPU v5 lite", {"bytes_limit": 15 * GiB})])
    assert (v5e.name, v5e.peak_flops, v5e.usable) == ("TPU v5e", 197e12, 15 * GiB)
    h100 = device_chip([_device("gpu", "NVIDIA H100 80GB HBM3", {"bytes_limit": 60 * GiB})])
    assert h100.peak_flops == GPUS["h100"].peak_flops and h100.usable == 60 * GiB
    assert device_chip([_device("tpu", "TPU v4", None)]) == CHIPS["v4"]
    other = device_chip([_device("gpu", "NVIDIA A10", {"bytes_limit": 20 * GiB})])
    assert other.peak_flops is None and other.hbm_bytes == 20 * GiB  # no time bound
    assert device_chip([_device("cpu", "cpu", None)] * 4).name.startswith("host CPU device (1/4")


def test_memory_against_the_plan_by_hand():
    plan = {"peak": 10 * GiB, "program": "decode", "step_s": 1.0}
    ok, line = memory_verdict({"gpu:0": {"peak": 10.9 * GiB, "limit": 60 * GiB},
                               "gpu:1": {"peak": 3 * GiB, "limit": 60 * GiB}}, plan)
    assert ok and "measured peak 10.90 GiB per chip, planned 10.00 GiB per chip (decode): +9%" \
        in line, line
    ok, line = memory_verdict({"gpu:0": {"peak": 11.2 * GiB, "limit": 0}}, plan)
    assert not ok and line.endswith("+12%, over the plan by more than 10%: FAIL"), line
    ok, line = memory_verdict({"cpu:0": None}, plan)
    assert ok and "not measured" in line
    ok, line = memory_verdict({"gpu:0": {"peak": GiB, "limit": 0}}, {"why": "model.lora.rank"})
    assert ok and "not compared with a plan (model.lora.rank)" in line


def _resolved(tmp_path, *overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[
            "model=tiny", "task=arith", "task.size=16", "trainer.batch_prompts=4",
            "algo.group_size=2", "trainer.max_new_tokens=8", "trainer.progress=false",
            "trainer.loggers=[]", f"trainer.run_dir={tmp_path}", *overrides])
    return OmegaConf.to_container(cfg, resolve=True)


def test_the_smoke_evaluates_plans_and_fails_on_memory_over_the_plan(tmp_path, monkeypatch):
    """The config evaluates at its ends: the smoke runs that evaluation once and plans the
    step on this CPU device at the longest prompt it met; the evaluation of 64 prompts is
    then the largest program (the rollout has 4 x 2 rows). A chip whose statistics show
    5 GiB against the tiny model's plan (well under 1 GiB) fails the smoke."""
    monkeypatch.setattr("rl.smoke.chip_peaks",
                        lambda: {"cpu:0": {"peak": 5 * GiB, "limit": 0}})
    r = smoke(_resolved(tmp_path, "trainer.eval_batch_size=64"))
    assert r["eval_s"] is not None and r["eval_s"] > 0
    assert r["plan"]["program"] == "eval decode" and 0 < r["plan"]["peak"] < GiB / 4
    assert r["plan"]["step_s"] is None  # a CPU device: no peak figures
    assert r["max_abs_diff"] == 0 and not r["passed"]
    text = report(r)
    assert "over the plan by more than 10%: FAIL" in text and text.endswith("rl.smoke: FAIL")
    assert "one evaluation" in text and "no planned bound for this chip" in text


def test_a_config_that_does_not_evaluate_is_smoked_without_one(tmp_path):
    r = smoke(_resolved(tmp_path, "trainer.eval_at_ends=false", "trainer.eval_every=0"))
    assert r["eval_s"] is None and r["passed"]
    assert not r["plan"]["program"].startswith("eval ")
    assert "one evaluation" not in report(r)
