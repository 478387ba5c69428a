"""The metrics reference keeps up with the code: every metric a training run writes to
metrics.jsonl is listed in docs/reference/metrics.md, and every file a run folder holds is
named in docs/reference/run-folder.md.

Three tiny training runs write their run folders once for the module (about 40 s on 2 CPU
cores): ARBOR on DAPO with off-policy rollouts on search_qa (memory/*, dapo/*, offpolicy/*, agent/*,
retrieval/*, judge/*, gaming/*, eval/*), ProRubric's official arm on rubric_chat (rubric/* with
the dimension counts, the task's eval/*) and RaR (static/*). A documented name with a
{placeholder} matches any value in that place."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.paths import CONF, ROOT

METRICS_PAGE = ROOT / "docs" / "reference" / "metrics.md"
FOLDER_PAGE = ROOT / "docs" / "reference" / "run-folder.md"
SOURCES = ("rl", "memory", "rewards", "judges", "core")
PLACEHOLDER_VALUE = "[A-Za-z0-9_.@-]+"  # what a {placeholder} of a documented name matches

COMMON = ["model=tiny", "trainer.progress=false", "trainer.loggers=[]",
          "trainer.sample_every=1", "trainer.save_every=0",
          # a random model's groups are homogeneous: update anyway, for the loss metrics
          "trainer.skip_zero_advantage=false"]
SEARCH = ["task=search_qa", "judge=rule", "task.n_entities=200", "task.n_train=40",
          "task.n_dev=2", "task.n_test=2", "task.max_turns=1", "task.max_response_tokens=64",
          "task.max_obs_tokens=40", "trainer.batch_prompts=2", "algo.group_size=4",
          "trainer.max_new_tokens=16"]
RUNS = {
    "arbor": [*SEARCH, "algo=arbor_dapo", "algo.embedder=hashing", "algo.max_gen_batches=2",
              "algo.rubric_gate=positive_only", "trainer.off_policy_steps=1",
              "trainer.max_steps=2", "trainer.eval_at_ends=true", "trainer.loggers=[tensorboard]"],
    "prorubric": ["task=rubric_chat", "algo=prorubric_official", "judge=rule",
                  "trainer.max_steps=1", "trainer.batch_prompts=2", "algo.group_size=2",
                  "trainer.max_new_tokens=8", "task.eval_size=2", "trainer.eval_at_ends=true"],
    "rar": [*SEARCH, "algo=rar", "trainer.max_steps=1", "trainer.eval_at_ends=false"],
}
#: what each family of the page is checked on: if a run stops writing one, the test says so
#: instead of passing on fewer metrics
EXPECTED = ("reward/mean", "groups/converted_frac", "loss", "lr", "update/skipped",
            "time/rollout_wait_s", "dapo/filled", "offpolicy/ratio_mean", "agent/turns",
            "retrieval/searches", "judge/requests_check", "judge_step/requests",
            "memory/rejected_low_variance", "memory/gated_frac", "gaming/copied_titles",
            "eval/outcome_mean", "eval/coverage", "rubric/judge_failed",
            "static/converted_frac")


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def documented_names(text: str) -> set[str]:
    """The names in the first cell of the page's table rows (one or more code spans)."""
    names: set[str] = set()
    for line in text.splitlines():
        cells = line.split("|")
        if line.startswith("|") and len(cells) > 2 and cells[1].strip().startswith("`"):
            names |= set(_code_spans(cells[1]))
    return names


def name_pattern(names: set[str]) -> re.Pattern[str]:
    """One regex matching every documented name, a {placeholder} matching any value."""
    alternatives = []
    for name in sorted(names):
        parts = re.split(r"(\{[^{}]+\})", name)
        alternatives.append("".join(PLACEHOLDER_VALUE if p.startswith("{") else re.escape(p)
                                    for p in parts))
    return re.compile("|".join(f"(?:{a})" for a in alternatives))


def _compose(*overrides: str) -> dict:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return OmegaConf.to_container(compose("config", overrides=list(overrides)),
                                      resolve=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The run folders of the three tiny runs (each trained, evaluated and closed)."""
    from rl.run.trainer import build_trainer

    root = tmp_path_factory.mktemp("metric_runs")
    out = {}
    for name, overrides in RUNS.items():
        run_dir = root / name
        world = [f"task.cache_dir={root / 'world'}"] if "task=search_qa" in overrides else []
        trainer = build_trainer(_compose(*COMMON, *overrides, *world,
                                         f"trainer.run_dir={run_dir}"))
        trainer.run_with_eval()  # closes the trainer
        out[name] = run_dir
    return out


def _metric_names(run_dir: Path) -> set[str]:
    names: set[str] = set()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            names |= set(json.loads(line))
    return names


def test_every_metric_a_run_writes_is_documented(runs):
    documented = documented_names(METRICS_PAGE.read_text())
    pattern = name_pattern(documented)
    written = set().union(*(_metric_names(d) for d in runs.values()))
    missing = [k for k in EXPECTED if k not in written]
    assert not missing, f"the tiny runs no longer write {missing}: change RUNS or EXPECTED"
    undocumented = sorted(k for k in written if not pattern.fullmatch(k))
    assert not undocumented, (f"metrics written to metrics.jsonl but not listed in "
                              f"{METRICS_PAGE.relative_to(ROOT)}: {undocumented}")


def test_placeholders_match_one_name_part_only():
    pattern = name_pattern({"step", "judge/requests_{op}", "memory/rejected_{reason}"})
    assert pattern.fullmatch("judge/requests_check")
    assert pattern.fullmatch("memory/rejected_low_variance")
    assert not pattern.fullmatch("judge/requests_")
    assert not pattern.fullmatch("judge/requests_a/b") and not pattern.fullmatch("steps")
    assert documented_names("| metric | x |\n| --- | --- |\n| `a/b`, `c_{k}` | y |\n") == {
        "a/b", "c_{k}"}


def test_every_documented_name_is_in_the_source():
    """The other direction, loosely: a listed name (without a placeholder) is spelled out in
    the library's source, whole or as its last part in quotes or at the end of an f-string
    (``f"judge/{k}"``, ``f"{prefix}converted_frac"``)."""
    source = "\n".join(p.read_text() for d in SOURCES for p in (ROOT / d).rglob("*.py"))
    stale = []
    for name in sorted(documented_names(METRICS_PAGE.read_text())):
        if "{" in name:
            continue
        last = re.escape(name.rsplit("/", 1)[-1])
        if name not in source and not re.search(f"[\"'}}]{last}[\"']", source):
            stale.append(name)
    assert not stale, f"{METRICS_PAGE.relative_to(ROOT)} lists names the code never writes: {stale}"


def test_every_file_of_a_run_folder_is_documented(runs):
    spans = _code_spans(FOLDER_PAGE.read_text())
    undocumented = set()
    for run_dir in runs.values():
        for entry in run_dir.iterdir():
            if not any(s == entry.name or s.startswith(entry.name + "/") for s in spans):
                undocumented.add(entry.name)
    assert not undocumented, (f"run folder entries not named in "
                              f"{FOLDER_PAGE.relative_to(ROOT)}: {sorted(undocumented)}")
