"""What a resumed run must agree with: the settings that change what the run computes.

Every checkpoint stores the run's *settings* (:func:`settings`): the resolved config flattened
to dotted keys (``optim.lr``, ``algo.beta``, ``task.train_path``...), plus values derived from
it that the config text does not show: the model architecture's hash (``model_config``), the
SHA-256 of every file a setting names (``<key>#sha256``: datasets, rubric files) and of the
training prompts (``task#train_prompts_sha256``, whatever produced them); ``model.lora.*``
only when LoRA is on (rank > 0), so a run from before LoRA existed resumes as rank 0. On resume
:func:`refuse_changes` compares them with the checkpoint's and refuses any difference outside
:data:`FREE` (what only decides how long, how often or where the run logs), naming each key
with both values, unless ``trainer.resume_allow_changes`` lists it (a key, or a section name
for all of its keys). ``model_config`` cannot be allowed: the saved arrays would not fit.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rl.run.config import ConfigError

log = logging.getLogger(__name__)

SETTINGS = "settings"  # the checkpoint metadata entry holding them

# keys (or sections) a resume may change freely: they decide when to stop, how often to
# evaluate, save and log, where, and how to reach outside services, not what is computed
FREE = (
    "hydra", "compile_cache", "eval", "mesh",
    "imports",  # where named factories are found; the names themselves are compared
    "trainer.run_dir", "trainer.resume", "trainer.resume_allow_changes",
    "trainer.save_every", "trainer.keep_checkpoints", "trainer.sample_every",
    "trainer.eval_split", "trainer.eval_batch_size", "trainer.eval_every", "trainer.eval_dtype",
    "trainer.eval_at_ends", "trainer.progress", "trainer.loggers", "trainer.wandb",
    "trainer.prefill_pin_rows",  # the prefill's memory layout, not its result
    "trainer.objective",  # what the run returns to a sweeper
    "task.eval_paths", "task.cache_dir", "task.retriever.url",
    "judge.base_url", "judge.api_key_env", "judge.max_concurrency", "judge.timeout_s",
    "judge.max_retries", "judge.cache_dir", "judge.breaker_timeouts", "judge.breaker_cooldown_s",
    "task.retrieval",  # the retriever's timeouts, retries, breaker and fault budget
    "judge.price_per_mtok_in", "judge.price_per_mtok_out",  # accounting only (judges.cost)
)
# trainer.max_steps too, unless the learning rate follows a cosine over all the steps
SCHEDULE_SPANS_MAX_STEPS = ("cosine",)
NEVER_ALLOWED = ("model_config",)
# keys added after checkpoints were written without them, with the value those runs computed
# with: a checkpoint lacking the key compares as having it
ADDED_LATER = {"trainer.off_policy_steps": 0, "trainer.kv_cache_dtype": "float32",
               "trainer.decode_kernel": "xla", "trainer.shared_prompts": False,
               "algo.rubric_gate": "none", "algo.correct_at": 1.0,
               "algo.rewarder_options.rubric_gate": "none",
               "algo.rewarder_options.correct_at": 1.0, "algo.filter_metric": "reward",
               "algo.lineage_in_induction": False, "algo.lineage_k": 3,
               "algo.rewarder_options.lineage_in_induction": False,
               "algo.rewarder_options.lineage_k": 3, "algo.consistency_filter": "none",
               "algo.consistency_remove": 2, "algo.consistency_reward": "outcome",
               "trainer.rollout_sub_batches": True, "model.revision": None,
               "trainer.rollout_chunks": 1,
               "algo.rewarder_options.aggregator": "additive_abs", "model.lora.quant": "none"}
# keys renamed after checkpoints were written under the old name: (old names, new name). A
# checkpoint's value moves to the new name when its old names agree on it (the positive-only
# gate's F1 threshold and PROF's correctness threshold became the one algo.correct_at)
RENAMED = ((("algo.consistency_correct", "algo.rubric_gate_f1"), "algo.correct_at"),
           (("algo.rewarder_options.rubric_gate_f1",), "algo.rewarder_options.correct_at"))


def renamed(old: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's settings under today's key names (:data:`RENAMED`), and the value of
    ``algo.consistency_reward`` a PROF run computed with before the key existed (it paid the
    rewarder's total)."""
    out = dict(old)
    if out.get("algo.consistency_filter") == "prof" and "algo.consistency_reward" not in out:
        out["algo.consistency_reward"] = "total"
    for names, new in RENAMED:
        values = {repr(out[k]) for k in names if k in out}
        if new not in out and len(values) == 1:
            value = next(out[k] for k in names if k in out)
            for k in names:
                out.pop(k, None)
            out[new] = value
    return out


def _under(key: str, prefixes: Sequence[str]) -> bool:
    return any(key == p or key.startswith(p + ".") or key.startswith(p + "#") for p in prefixes)


def flatten(cfg: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a.b.c": value} for every leaf of a nested mapping (lists are values)."""
    out: dict[str, Any] = {}
    for k, v in cfg.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out |= flatten(v, key + ".")
        else:
            out[key] = v
    return out


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def prompts_sha256(prompts: Sequence[Any]) -> str:
    """SHA-256 of the prompts' JSON (ids, messages, answers: everything they carry)."""
    import dataclasses

    rows = [dataclasses.asdict(p) if dataclasses.is_dataclass(p) and not isinstance(p, type)
            else p for p in prompts]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()


def settings(raw: Mapping[str, Any], model_config_hash: str, train_prompts: Sequence[Any]
             ) -> dict[str, Any]:
    """The run's settings as a checkpoint stores them (JSON)."""
    flat = flatten({k: v for k, v in raw.items() if k != "hydra"})
    if not flat.get("model.lora.rank"):  # LoRA off: its alpha and targets compute nothing
        flat = {k: v for k, v in flat.items() if not _under(k, ["model.lora"])}
    out = dict(flat)
    for key, value in flat.items():  # the contents of the files the settings name
        if isinstance(value, str) and not _under(key, FREE) and value and Path(value).is_file():
            out[f"{key}#sha256"] = file_sha256(Path(value))
    out["model_config"] = model_config_hash
    out["task#train_prompts_sha256"] = prompts_sha256(train_prompts)
    return json.loads(json.dumps(out, default=str))  # as it reads back from the checkpoint


def free(key: str, old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """May `key` change on resume without being allowed?"""
    if key == "trainer.max_steps":
        return not ({old.get("optim.schedule"), new.get("optim.schedule")}
                    & set(SCHEDULE_SPANS_MAX_STEPS))
    return _under(key, FREE)


_ABSENT = "(absent)"


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{key: (checkpoint's value, this run's value)} of the settings that differ and are not
    free to change."""
    old = {**{k: v for k, v in ADDED_LATER.items() if k in new}, **renamed(old)}
    keys = sorted(set(old) | set(new))
    return {k: (old.get(k, _ABSENT), new.get(k, _ABSENT)) for k in keys
            if old.get(k, _ABSENT) != new.get(k, _ABSENT) and not free(k, old, new)}


def _why(key: str) -> str:
    if key == "trainer.max_steps":
        return " (the cosine learning-rate schedule spans trainer.max_steps)"
    return ""


def refuse_changes(old: Mapping[str, Any], new: Mapping[str, Any], allowed: Sequence[str],
                   where: str) -> dict[str, tuple[Any, Any]]:
    """The allowed changes between a checkpoint's settings and this run's; ConfigError naming
    every other change (key, checkpoint's value, this run's value), and any entry of
    `allowed` that names no setting."""
    for entry in allowed:
        if not any(_under(k, [entry]) for k in (*old, *new)):
            raise ConfigError(f"trainer.resume_allow_changes: {entry!r} is not a config key "
                              f"or section")
    diff = changes(old, new)
    never = [k for k in diff if k in NEVER_ALLOWED]
    if never:
        raise ConfigError(f"trainer.run_dir: the checkpoint {where} belongs to an incompatible "
                          f"run: another model architecture ({never[0]} {diff[never[0]][0]} -> "
                          f"{diff[never[0]][1]}); its arrays cannot be restored")
    refused = {k: v for k, v in diff.items() if not _under(k, allowed)}
    if refused:
        listed = "; ".join(f"{k}: {a!r} (checkpoint) -> {b!r} (now){_why(k)}"
                           for k, (a, b) in refused.items())
        raise ConfigError(
            f"trainer.resume: the checkpoint {where} was written with other settings "
            f"(incompatible: they change what the run computes): {listed}. Resume with the "
            f"checkpoint's values, or allow the change deliberately with "
            f"trainer.resume_allow_changes=[{','.join(refused)}]")
    allowed_diff = {k: v for k, v in diff.items() if k not in refused}
    for k, (a, b) in allowed_diff.items():
        log.warning("resume %s: %s changes from %r to %r (trainer.resume_allow_changes)",
                    where, k, a, b)
    return allowed_diff
