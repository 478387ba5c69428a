"""The first command to run on a new slice or cluster: ``python -m rl.smoke [overrides]``.

The run's own config (the same hydra overrides as ``rl.train``: model, mesh, task, ...), on
every host of the job as ``rl.train`` is, then:

1. join the job and load the model sharded, timed (``<trainer.run_dir>/straight``);
2. train 3 steps straight;
3. in ``<trainer.run_dir>/resumed``: train 2 steps and save, then build a fresh trainer that
   restores the checkpoint (as a restarted job does) and trains the third step;
4. compare the two runs' final parameters, each process its own shards;
5. when the config evaluates during training (trainer.eval_at_ends, trainer.eval_every),
   run that evaluation once on the straight run's weights, timed;
6. plan the step on the job's own devices (``rl.plan``'s programs compiled for them, at the
   longest prompt the steps met) and read each local chip's peak memory after the straight
   run and its evaluation (``memory_stats()``, where the backend reports it);
7. print the devices of each process, the load times, the step times beside the plan's
   lower bound, the measured memory beside the planned, and a verdict: ``rl.smoke: PASS``
   (exit 0) when the resumed run ends within 1e-5 of the straight one (bit-identical is
   expected and said) and no chip's peak exceeds the plan's by more than 10 %, else FAIL.

    python -m rl.smoke model=hf model.path=/ckpt/Qwen3-4B mesh=fsdp trainer.run_dir=/shared/smoke

It writes ``smoke.json`` (the figures) into ``trainer.run_dir``. The steps use the config's
batch and lengths; for a quick check shrink them (``trainer.batch_prompts``,
``trainer.max_new_tokens``).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

import hydra
import numpy as np
from omegaconf import DictConfig, OmegaConf

from rl.run.compile_cache import use_compile_cache
from rl.run.folder import run_path
from rl.run.quiet import quiet_library_logs
from rl.run.resolve import resolved_config

log = logging.getLogger("rl.smoke")

STEPS, SAVED_AT = 3, 2
TOLERANCE = 1e-5  # the multi-process tests' bound: another layout may round differently
MEMORY_MARGIN = 0.10  # a chip's measured peak this far over the plan's fails the smoke

GiB = 1024**3


def _build(resolved: dict, run_dir: Any, **trainer: Any) -> tuple[Any, float]:
    """A trainer for `run_dir` with `trainer` settings over the config's; its build time."""
    from rl.run.trainer import build_trainer

    cfg = json.loads(json.dumps(resolved))
    cfg["trainer"] |= {"run_dir": str(run_dir), "max_steps": STEPS, "eval_at_ends": False,
                       "eval_every": 0, **trainer}
    t0 = time.perf_counter()
    built = build_trainer(cfg, OmegaConf.to_yaml(OmegaConf.create(cfg)))
    return built, time.perf_counter() - t0


def max_difference(a: Any, b: Any) -> float:
    """The largest |a - b| over every parameter, each process comparing the shards it holds
    and the job taking the largest (an all-gather of one number per process)."""
    import jax
    from jax.experimental import multihost_utils

    local = 0.0
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        for sx, sy in zip(x.addressable_shards, y.addressable_shards, strict=True):
            diff = np.abs(np.asarray(sx.data, np.float64) - np.asarray(sy.data, np.float64))
            local = max(local, float(diff.max(initial=0.0)))
    if jax.process_count() == 1:
        return local
    return float(np.max(multihost_utils.process_allgather(np.float32(local))))


def chip_peaks() -> dict[str, dict[str, float] | None]:
    """Each local device's peak and limit in bytes (``memory_stats``), None where the
    backend reports none (CPU)."""
    import jax

    peaks: dict[str, dict[str, float] | None] = {}
    for d in jax.local_devices():
        stats = d.memory_stats() or {}
        peaks[f"{d.platform}:{d.id}"] = ({"peak": stats["peak_bytes_in_use"],
                                          "limit": stats.get("bytes_limit") or 0}
                                         if "peak_bytes_in_use" in stats else None)
    return peaks


def chip_memory(peaks: dict[str, dict[str, float] | None]) -> list[str]:
    """A line per local device: its peak and limit, or why there are none."""
    return [f"{name} peak {p['peak'] / GiB:.2f} GiB"
            + (f" of {p['limit'] / GiB:.2f} GiB" if p["limit"] else "")
            if p else f"{name} (no memory statistics on this backend)"
            for name, p in peaks.items()]


def planned(resolved: dict, parts: Any, prompt_len: int) -> dict[str, Any]:
    """The step planned on this job's own devices (``rl.plan.plan_on``: its programs
    compiled for them, at `prompt_len` prompt tokens and the response budget of the run's
    built `parts`, no batch search): the largest per-chip peak of a program the config runs
    (with what stays resident), and the step's lower time bound where the chip's peak
    figures are known; ``why`` instead where the plan cannot be made (a LoRA run)."""
    import jax

    from rl.plan import device_chip, plan_on, step_bound
    from rl.run.config import ConfigError, parse_plan

    section = {"topology": "this job's devices", "model_shapes": str(resolved["model"]["path"]),
               "prompt_len": prompt_len, "response_budget": parts.response_budget,
               "rollout_fit": False, "slices": 1}
    try:
        run, plan = parse_plan({**resolved, "plan": section})
    except ConfigError as e:
        return {"why": str(e)}
    devices = jax.devices()
    p = plan_on(run, plan, parts.model_cfg, devices, device_chip(devices))
    top = max((q for q in p.programs if q.runs), key=lambda q: q.peak)
    bound = step_bound(run, p)
    return {"peak": top.peak, "program": top.name, "step_s": bound[0] if bound else None}


def memory_verdict(peaks: dict[str, dict[str, float] | None],
                   plan: dict[str, Any]) -> tuple[bool, str]:
    """(within the plan, the line saying so): the largest local peak against the plan's
    (:data:`MEMORY_MARGIN` over it fails); nothing to compare without a plan or statistics."""
    measured = [p["peak"] for p in peaks.values() if p]
    if "peak" not in plan:
        return True, f"memory: not compared with a plan ({plan.get('why', 'none made')})"
    planned_gib = f"{plan['peak'] / GiB:.2f} GiB per chip ({plan['program']})"
    if not measured:
        return True, (f"memory: planned {planned_gib}; not measured (no memory statistics "
                      "on this backend)")
    over = max(measured) / plan["peak"] - 1
    ok = over <= MEMORY_MARGIN
    return ok, (f"memory: measured peak {max(measured) / GiB:.2f} GiB per chip, planned "
                f"{planned_gib}: {over:+.0%}, "
                + (f"within the plan's +{MEMORY_MARGIN:.0%}" if ok else
                   f"over the plan by more than {MEMORY_MARGIN:.0%}: FAIL"))


def evaluate_once(resolved: dict, trainer: Any) -> float | None:
    """The config's evaluation during training, run once at the trainer's step (its
    programs compiled and run as the run's own would be); its seconds, or None when the
    config does not evaluate during training."""
    t = resolved["trainer"]
    if not (t.get("eval_at_ends") or t.get("eval_every")):
        return None
    log.info("rl.smoke: evaluating once, as the run evaluates during training")
    start = time.perf_counter()
    trainer.evaluate(trainer.loop.step)
    return time.perf_counter() - start


def smoke(resolved: dict) -> dict[str, Any]:
    """Steps 1-4 of the module docstring; the figures, ``passed`` among them."""
    import jax

    run_dir = run_path(str(resolved["trainer"]["run_dir"]))  # a local folder or a gs:// URL
    log.info("rl.smoke: 1/3 loading %s and training %d steps (%s)", resolved["model"]["path"],
             STEPS, run_dir / "straight")
    t = resolved["trainer"]  # the straight run reads the evaluation split as the run does
    straight, load_s = _build(resolved, run_dir / "straight", save_every=0, resume=False,
                              eval_at_ends=t["eval_at_ends"], eval_every=t["eval_every"])
    log.info("rl.smoke: loaded in %.1f s", load_s)
    straight_steps = straight.run()
    eval_s = evaluate_once(resolved, straight)
    peaks = chip_peaks()  # one trainer's peak, before the next is built beside its weights
    prompt_len = max(int(r["prompt/length_max"]) for r in straight_steps)
    log.info("rl.smoke: planning the step on this job's devices (prompt %d tokens)", prompt_len)
    plan = planned(resolved, straight.parts, prompt_len)
    straight.close()
    log.info("rl.smoke: 2/3 training %d steps and saving (%s)", SAVED_AT, run_dir / "resumed")
    first, _ = _build(resolved, run_dir / "resumed", save_every=SAVED_AT, resume=False)
    first_steps = first.run(until=SAVED_AT)
    first.close()
    log.info("rl.smoke: 3/3 restoring step %d into a fresh trainer, training step %d",
             SAVED_AT, STEPS)
    resumed, reload_s = _build(resolved, run_dir / "resumed", save_every=SAVED_AT, resume=True)
    if resumed.start_step != SAVED_AT:
        raise RuntimeError(f"rl.smoke: the resume started at step {resumed.start_step}, not at "
                           f"the checkpoint of step {SAVED_AT} ({run_dir / 'resumed'})")
    last_steps = resumed.run()
    resumed.close()
    diff = max_difference(straight.state.params, resumed.state.params)
    devices = jax.devices()
    memory_ok, memory_line = memory_verdict(peaks, plan)
    return {"processes": jax.process_count(), "devices": len(devices),
            "platform": devices[0].platform, "device_kind": devices[0].device_kind,
            "mesh": dict(straight.parts.mesh.shape) if straight.parts.mesh else None,
            "model": resolved["model"]["path"], "load_s": load_s, "resume_load_s": reload_s,
            "straight_step_s": [r["time/step_s"] for r in straight_steps],
            "resumed_step_s": [r["time/step_s"] for r in (*first_steps, *last_steps)],
            "eval_s": eval_s, "plan": plan, "memory_check": memory_line,
            "max_abs_diff": diff, "passed": diff <= TOLERANCE and memory_ok,
            "memory": chip_memory(peaks),
            "process_devices": [", ".join(f"{d.platform}:{d.id}" for d in devices
                                          if d.process_index == i)
                                for i in range(jax.process_count())]}


def time_line(r: dict[str, Any]) -> str:
    """The steps after the first (which compiles) beside the plan's lower bound; the
    evaluation's time."""
    after = r["straight_step_s"][1:] or r["straight_step_s"]
    bound = r["plan"].get("step_s")
    line = (f"step time: {np.median(after):.2f} s (median after the first)"
            + (f", the plan's lower bound {bound:.2f} s ({np.median(after) / bound:.1f}x)"
               if bound else ", no planned bound for this chip"))
    if r.get("eval_s") is not None:
        line += f"; one evaluation {r['eval_s']:.1f} s"
    return line


def report(r: dict[str, Any]) -> str:
    mesh = " ".join(f"{k}={v}" for k, v in (r["mesh"] or {}).items()) or "one device"
    steps = lambda xs: ", ".join(f"{x:.2f}" for x in xs)  # noqa: E731
    same = ("bit-identical" if r["max_abs_diff"] == 0 else
            f"max abs diff {r['max_abs_diff']:.3g}, within {TOLERANCE:g}" if r["passed"] else
            f"max abs diff {r['max_abs_diff']:.3g}, over {TOLERANCE:g}")
    return "\n".join([
        f"rl.smoke: {r['model']} on {r['processes']} process(es), {r['devices']} "
        f"{r['platform']} device(s) ({r['device_kind']}), mesh {mesh}",
        *(f"  process {i}: devices {ids}" for i, ids in enumerate(r.get("process_devices", []))),
        f"  load: {r['load_s']:.1f} s; resume from the checkpoint: {r['resume_load_s']:.1f} s",
        f"  steps, straight: {steps(r['straight_step_s'])} s (the first compiles)",
        f"  steps, saved at {SAVED_AT} and resumed: {steps(r['resumed_step_s'])} s",
        f"  {time_line(r)}",
        *(f"  memory {line}" for line in r["memory"]),
        f"  {r['memory_check']}",
        f"  resumed run against the straight run: {same}",
        f"rl.smoke: {'PASS' if r['passed'] else 'FAIL'}"])


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    import jax

    quiet_library_logs()
    use_compile_cache(cfg.get("compile_cache"))
    resolved = resolved_config(cfg)
    result = smoke(resolved)
    print(report(result), flush=True)
    if jax.process_index() == 0:
        out = run_path(str(resolved["trainer"]["run_dir"])) / "smoke.json"
        out.write_text(json.dumps(result, indent=1))
    if not result["passed"]:
        sys.exit(1)


if __name__ == "__main__":
    from rl.run.resolve import print_help_first

    print_help_first(__doc__)
    main()
