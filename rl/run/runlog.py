"""The run folder: resolved config, metrics.jsonl, TensorBoard events, samples, event logs.

    run_dir/
      config.yaml          resolved hydra config of the run's first steps (kept on resume)
      config_history.jsonl one record per start and resume: its step, the changes it was
                           allowed (trainer.resume_allow_changes) and its resolved config
      metrics.jsonl        one JSON object per step
      tb/                  TensorBoard event files (same scalars; trainer.loggers, rl.run.loggers)
      wandb/, wandb_id     the W&B run (trainer.loggers=[tensorboard,wandb])
      samples.jsonl        sample trajectories with their rewards
      memory_events.jsonl  rubric memory events (ARBOR)
      checkpoints/         orbax checkpoints

A run folder on object storage (``trainer.run_dir=gs://...``) gets the same files: they are
written in a local folder and copied there (:mod:`rl.run.mirror`).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from core.files import write_atomic
from rl.run.loggers import LoggerContext, WandbOptions, open_loggers
from rl.run.mirror import RunMirror

log = logging.getLogger(__name__)


def _clean(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def truncate_jsonl(path: Path, keep: Callable[[dict], bool]) -> list[dict]:
    """Drop lines whose parsed record fails `keep` (used on resume to forget the future);
    returns the kept records. The file is replaced atomically (``core.files.write_atomic``): a
    kill during the rewrite leaves the old file whole.

    A last line that does not parse was cut off mid-write (the run was killed): it is dropped
    with a warning. Any other line that does not parse is kept as it is, with a warning."""
    if not path.exists():
        return []
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept, records = [], []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            last = i == len(lines) - 1
            log.warning("%s: line %d is not JSON; %s", path, i + 1,
                        "dropped (cut off mid-write)" if last else "kept as it is")
            if not last:
                kept.append(line)
            continue
        if not isinstance(record, dict) or keep(record):
            kept.append(line)
            records.append(record)
    write_atomic(path, "".join(ln + "\n" for ln in kept))
    return [r for r in records if isinstance(r, dict)]


def _before(step: int) -> Callable[[dict], bool]:
    """Records of a run resumed at `step`: those of earlier steps, and the evaluation logged at
    `step` itself (it scored the checkpoint's weights; training step `step` is redone)."""
    return lambda r: r.get("step", -1) < step or (
        r.get("step") == step and any(k.startswith("eval/") for k in r))


class RunLog:
    def __init__(self, run_dir: str | Path, resume_step: int | None = None,
                 loggers: Sequence[str] = ("tensorboard",), wandb: WandbOptions | None = None,
                 config: Mapping[str, Any] | None = None, active: bool = True,
                 mirror: RunMirror | None = None):
        """`active` False (the processes of a multi-process job other than 0): the same
        calls, nothing written (process 0 writes the run folder). `mirror`: for a run folder
        on object storage, `run_dir` is its local folder and the mirror copies it there."""
        self.dir = Path(run_dir)
        self.active = active
        self.mirror = mirror if active else None
        self.latest: dict[str, float] = {}  # each metric's last logged value (every process)
        self._loggers: list[Any] = []
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        self.events_path = self.dir / "memory_events.jsonl"
        self.alerts_path = self.dir / "alerts.jsonl"
        self.lineage_path = self.dir / "memory_lineage.jsonl"
        if not active:
            return
        if self.mirror is not None:
            self.mirror.pull()
        self.dir.mkdir(parents=True, exist_ok=True)
        kept: list[dict] = []  # the metrics records a resumed run keeps
        if resume_step is not None:  # a resumed run rewrites everything after its checkpoint
            kept = truncate_jsonl(self.metrics_path, _before(resume_step))
            for p in (self.samples_path, self.events_path, self.alerts_path,
                      self.lineage_path):
                truncate_jsonl(p, _before(resume_step))
        else:
            for p in (self.metrics_path, self.samples_path, self.events_path, self.alerts_path,
                      self.lineage_path):
                p.unlink(missing_ok=True)
        self._loggers = open_loggers(loggers, LoggerContext(self.dir, resume_step, wandb,
                                                            dict(config or {})))
        for record in kept:  # TensorBoard's purge also took the kept evaluation's scalars
            if record.get("step") == resume_step:
                self._scalars(record)

    def write_config(self, text: str, name: str = "config.yaml") -> None:
        if self.active:
            write_atomic(self.dir / name, text)

    def config_history(self, record: Mapping[str, Any]) -> None:
        """Append a start's record (with the time) to config_history.jsonl, atomically."""
        self.append_start(record, "config_history.jsonl")

    def append_start(self, record: Mapping[str, Any], name: str) -> None:
        """Append a start's record (with the time) to the run folder's `name`, atomically:
        the records of earlier starts stay."""
        if not self.active:
            return
        path = self.dir / name
        old = path.read_text() if path.exists() else ""
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **record}, default=str)
        write_atomic(path, old + line + "\n")

    def metrics(self, step: int, values: Mapping[str, Any]) -> dict[str, Any]:
        record = {"step": step, **{k: _clean(v) for k, v in values.items()}}
        self.latest.update({k: v for k, v in record.items()
                            if isinstance(v, int | float) and not isinstance(v, bool)})
        if not self.active:
            return record
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self._scalars(record)
        self.sync()
        return record

    def sync(self, force: bool = False) -> None:
        """Copy the run log to a run folder on object storage (throttled unless `force`;
        nothing for a local run folder)."""
        if self.mirror is not None:
            self.mirror.sync(force)

    def _scalars(self, record: Mapping[str, Any]) -> None:
        values = {k: v for k, v in record.items()
                  if k != "step" and isinstance(v, int | float) and not isinstance(v, bool)}
        for logger in self._loggers:
            logger.scalars(record["step"], values)

    def _append(self, path: Path, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        if not self.active:
            return
        with path.open("a") as f:
            for r in records:
                f.write(json.dumps({"step": step, **r}, default=str) + "\n")

    def samples(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        self._append(self.samples_path, step, records)

    def events(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        self._append(self.events_path, step, records)

    def alerts(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        self._append(self.alerts_path, step, records)

    def lineage(self, step: int, records: Iterable[Mapping[str, Any]]) -> None:
        self._append(self.lineage_path, step, records)

    def close(self) -> None:
        for logger in self._loggers:
            logger.close()
        self._loggers = []
        self.sync(force=True)
