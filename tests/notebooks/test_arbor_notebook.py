"""``notebooks/arbor.ipynb`` executes on run folders (so it cannot rot).

The run folders are written in the trainer's formats (``RunLog``: ``metrics.jsonl``,
``memory_events.jsonl``, ``config.yaml``) by the real rewarders on hand-written Search-R1
groups (see ``test_arbor_e2e``), over enough steps that the memory admits, consolidates,
activates and retires rubrics: GRPO (outcome), ARBOR and ARBOR w/o memory. No model is trained,
which keeps the test fast; the trainer's own use of these formats is tested in
``test_arbor_e2e``.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import nbformat
import numpy as np
import pytest
import yaml
from nbclient import NotebookClient
from tests.rl.rewarders.test_arbor_e2e import hand_prompts, scripted_groups

from judges import RuleJudge
from rl.grpo.group_stats import all_wrong_frac, converted_frac, homogeneous_frac
from rewards.gaming import step_monitors
from rl.run.runlog import RunLog
from rl.tasks.search.task import SearchQATask
from rl.run.wiring import make_rewarder
from tests.paths import ROOT

NOTEBOOK = ROOT / "notebooks" / "arbor.ipynb"
STEPS = 12


def _recipes(step: int) -> list[str]:
    # Steps 0-5: informative groups. Steps 6-8: the "policy" has mastered the process (groups
    # all good or all broken), so the active rubrics stop discriminating and retire as
    # mastered. Steps 9-11: informative again, new drafts and rubrics.
    if 6 <= step < 9:
        return ["all_good", "all_invalid", "all_good", "all_good"]
    return ["mixed", "all_wrong", "mixed", "all_invalid"]


def fake_run(run_dir: Path, algo: str, rewarder: str, options: dict) -> None:
    """A run folder in the trainer's formats, from the real rewarder (no model)."""
    task = SearchQATask()
    rw = make_rewarder(rewarder, task, options, None if rewarder == "outcome" else RuleJudge())
    log = RunLog(run_dir, loggers=())
    log.write_config(yaml.safe_dump({"algo": {"name": algo, "rewarder": rewarder, **options},
                                     "task": {"name": "search_qa"}}))
    ps = hand_prompts()
    state = rw.init_state()
    for step in range(STEPS):
        prompts = [ps[(4 * step + i) % len(ps)] for i in range(4)]
        groups = scripted_groups(prompts, _recipes(step), seed=step)
        out = rw(groups, state, step)
        state = out.state
        o, r = jnp.asarray(out.outcome), jnp.asarray(out.rewards)
        if step in (0, STEPS - 1):
            log.metrics(step, {"eval/outcome_mean": float(np.mean(out.outcome)), "eval/n": 4})
        gaming, found = step_monitors(groups, out)
        if gaming:
            log.alerts(step, list(found))
        log.metrics(step, {**gaming,
                           "reward/mean": float(r.mean()), "outcome/mean": float(o.mean()),
                           "groups/homogeneous_frac": float(homogeneous_frac(o)),
                           "groups/all_wrong_frac": float(all_wrong_frac(o)),
                           "groups/converted_frac": float(converted_frac(o, r)),
                           **dict(out.metrics)})
        if out.events:
            log.events(step, out.events)
        if hasattr(rw, "lineage") and (retired := rw.lineage(state, step)):
            log.lineage(step, retired)
    log.close()
    (run_dir / "eval.json").write_text(json.dumps(
        {"source": str(run_dir), "results": {"test": {"em": 0.25, "f1": 0.3},
                                             "average": {"em": 0.25, "f1": 0.3}}}))


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arbor_runs")
    # a strict correlation gate (rho_min .75) so some rule-judge drafts are rejected
    common = {"embedder": "hashing", "k_consol": 4, "retire_k": 2, "rho_min": 0.75, "seed": 0}
    fake_run(root / "grpo_s0", "grpo", "outcome", {})
    fake_run(root / "arbor_s0", "arbor", "arbor", common)
    fake_run(root / "arbor_no_memory_s0", "arbor_no_memory", "arbor",
             {**common, "use_common_pool": False})
    return root


def test_fixture_runs_exercise_the_whole_lifecycle(runs_dir):
    events = [json.loads(x) for x in
              (runs_dir / "arbor_s0" / "memory_events.jsonl").read_text().splitlines()]
    kinds = {e["kind"] for e in events}
    assert {"admitted", "rejected", "consolidated", "activated", "retired"} <= kinds
    # memory_lineage.jsonl: one record per retirement event, at its step, with its reason;
    # the mastered ones ranked 1, 2, ... in the order they were mastered
    lineage = [json.loads(x) for x in
               (runs_dir / "arbor_s0" / "memory_lineage.jsonl").read_text().splitlines()]
    retired = [(e["step"], e["common_id"], e["reason"]) for e in events if e["kind"] == "retired"]
    assert sorted((r["step"], r["common_id"], r["reason"]) for r in lineage) == sorted(retired)
    ranks = [r["mastery_rank"] for r in sorted(lineage, key=lambda r: (r["step"],
                                                                      r["common_id"]))
             if r["reason"] == "mastered"]
    assert ranks == list(range(1, len(ranks) + 1))


def test_notebook_executes_on_run_folders(runs_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("ARBOR_RUNS", str(runs_dir))
    monkeypatch.setenv("ARBOR_FIGS", str(tmp_path / "figs"))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "\n".join(o.get("text", "") + json.dumps(o.get("data", {}).get("text/plain", ""))
                     for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "3 run folder(s)" in text
    assert "Evidence-grounded answer" in text  # the top-reused table names a common rubric
    figs = {p.name for p in (tmp_path / "figs").iterdir()}
    assert {"learning_curves.png", "group_fractions.png", "memory_size.png", "admission.png",
            "lifecycle_arbor_s0.png", "gaming.png", "lineage_arbor_s0.png"} <= figs
    assert "alert(s)" in text
    assert "order of mastery" in text
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
