"""Orbax checkpoints of the whole loop state: parameters, optimizer, step, data position and
the rewarder's host-side state (e.g. the rubric memory), so a resumed run
continues exactly.

Every checkpoint carries its own integrity record in its metadata: the SHA-256 of every
saved array's bytes (with its dtype and shape) and of the rest of the metadata (the rubric
memory / reward state, data position, step, settings). :meth:`Checkpointer.restore_verified`
recomputes them on the restored values; :meth:`Checkpointer.restore_latest_valid` walks back
from the newest checkpoint to the newest one that restores and verifies, setting the broken
ones aside (``checkpoints_corrupt/``), never deleting them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)

INTEGRITY = "integrity"  # the metadata entry holding the checksums


class CheckpointError(RuntimeError):
    """No checkpoint of a run folder can be restored."""


class CorruptCheckpoint(CheckpointError):
    """One checkpoint is incomplete or its bytes differ from what was saved."""


def array_digest(x: Any) -> str | None:
    """SHA-256 over an array's dtype, shape and bytes (None for an array spread over several
    hosts, which one process cannot read whole)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return None
    a = np.ascontiguousarray(np.asarray(jax.device_get(x)))
    h = hashlib.sha256(f"{a.dtype}{a.shape}".encode())
    h.update(memoryview(a.reshape(-1).view(np.uint8)))
    return h.hexdigest()


def tree_digests(tree: Any) -> dict[str, str | None]:
    """{path in the tree: array_digest} for every leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): array_digest(leaf) for path, leaf in leaves}


def json_digest(obj: Any) -> str:
    """SHA-256 of a JSON value as it is saved (keys sorted; tuples and lists alike)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def with_integrity(tree: Any, meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` plus the checksums of `tree`'s arrays and of `meta` itself."""
    return {**meta, INTEGRITY: {"algorithm": "sha256", "arrays": tree_digests(tree),
                                "meta": json_digest(meta)}}


def integrity_problems(tree: Any, meta: dict[str, Any]) -> list[str]:
    """What differs between restored values and the checksums saved with them (empty: all
    agree). The arrays a process could not read whole (None) are not compared."""
    saved = meta[INTEGRITY]
    rest = {k: v for k, v in meta.items() if k != INTEGRITY}
    problems = [] if json_digest(rest) == saved["meta"] else [
        "its metadata (reward state / rubric memory, data position) fails its checksum"]
    now = tree_digests(tree)
    for key, digest in saved["arrays"].items():
        if key not in now:
            problems.append(f"array {key} is missing")
        elif digest is not None and now[key] is not None and digest != now[key]:
            problems.append(f"array {key} fails its checksum")
    return problems


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int | None = 2):
        """`keep`: how many of the newest checkpoints stay (None: all)."""
        self.dir = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.dir, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def step_dirs(self) -> list[int]:
        """Steps with a folder here, newest first: those orbax lists and integer-named folders
        it does not (emptied or never finalised)."""
        on_disk = {int(p.name) for p in self.dir.iterdir() if p.is_dir() and p.name.isdigit()}
        return sorted(on_disk | set(self.manager.all_steps()), reverse=True)

    def save(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        """Save `tree` (a dict of pytrees of arrays) and `meta` (JSON) with their checksums."""
        meta = with_integrity(tree, meta)
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)))
        self.manager.wait_until_finished()

    def read_meta(self, step: int) -> dict[str, Any]:
        out = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))
        return dict(out["meta"])

    def restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """Restore onto the structure, dtypes and shardings of `like` (a dict of pytrees of
        arrays). A checkpoint written before the constant ``rng`` entry was dropped (it held
        the same key at every step and nothing read it) restores too, without it."""
        state, meta = self._restore_saved(step, like)
        return {k: v for k, v in state.items() if k in like}, meta

    def _restore_saved(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """Everything saved at `step`, with the old ``rng`` entry when the checkpoint has one."""
        like = {**self._saved_beyond(step, like), **like}
        try:
            return self._restore(step, like)
        except ValueError as e:
            if "rng:" not in str(e) or "rng" in like:
                raise
        return self._restore(step, {**like, "rng": jax.random.key_data(jax.random.key(0))})

    def _saved_beyond(self, step: int, like: Any) -> dict[str, Any]:
        """Host-memory shapes for the entries saved at `step` that `like` does not ask for (an
        off-policy run's sampler weights, when ``rl.eval`` reads its parameters): restored
        and verified with the rest, then dropped by the callers."""
        try:
            saved = ocp.StandardCheckpointHandler().metadata(self.dir / str(step) / "state").tree
        except Exception:  # no readable metadata: the restore itself says what is wrong
            return {}
        cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
        return {k: jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=cpu),
                                v) for k, v in dict(saved).items() if k not in like and k != "rng"}

    def _restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def meta_verified(self, step: int) -> dict[str, Any]:
        """The metadata of `step`, or CorruptCheckpoint saying why it cannot be read."""
        if step not in self.manager.all_steps():
            raise CorruptCheckpoint(f"step {step} ({self.dir / str(step)}): incomplete (orbax "
                                    f"does not list it as a finished checkpoint)")
        try:
            return self.read_meta(step)
        except Exception as e:  # orbax and JSON errors alike: name the step and the folder
            raise CorruptCheckpoint(f"step {step} ({self.dir / str(step)}): metadata "
                                    f"unreadable: {type(e).__name__}: {e}") from e

    def restore_verified(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        """`restore`, then the checksums compared; CorruptCheckpoint names step, folder and
        what is wrong. A checkpoint written before checksums existed restores unverified."""
        where = f"step {step} ({self.dir / str(step)})"
        try:
            saved, meta = self._restore_saved(step, like)
        except Exception as e:
            raise CorruptCheckpoint(f"{where}: unreadable: {type(e).__name__}: {e}") from e
        if INTEGRITY not in meta:
            log.warning("%s: written without checksums (an older version); restored "
                        "unverified", where)
        elif problems := integrity_problems(saved, meta):
            raise CorruptCheckpoint(f"{where}: {'; '.join(problems)}")
        return {k: v for k, v in saved.items() if k in like}, meta

    def restore_latest_valid(self, like: Any, check: Callable[[int, dict[str, Any]], None]
                             ) -> tuple[int, Any, dict[str, Any]]:
        """(step, state, meta) of the newest checkpoint that restores and verifies. `check`
        sees each candidate's metadata first (it raises to refuse the run, e.g. changed
        settings). Newer broken checkpoints are named in a warning, with how many steps
        are trained again, and moved to ``checkpoints_corrupt/``; CheckpointError when none
        is valid (nothing is moved then)."""
        broken: list[tuple[int, str]] = []
        for step in self.step_dirs():
            try:
                meta = self.meta_verified(step)
                check(step, meta)
                state, meta = self.restore_verified(step, like)
            except CorruptCheckpoint as e:
                broken.append((step, str(e)))
                continue
            if broken:
                self._fall_back(step, broken)
            return step, state, meta
        raise CheckpointError(f"{self.dir}: no valid checkpoint to resume from: " + "; ".join(
            reason for _, reason in broken))

    def _fall_back(self, step: int, broken: list[tuple[int, str]]) -> None:
        newest = broken[0][0]
        log.warning("checkpoint(s) %s not usable: %s. Resuming from step %d instead: steps "
                    "%d-%d (%d) are trained again; the broken ones are moved to %s",
                    ", ".join(str(s) for s, _ in broken), "; ".join(r for _, r in broken),
                    step, step, newest - 1, newest - step, self.corrupt_dir)
        for s, _ in broken:
            self._set_aside(s)
        self.manager.reload()

    @property
    def corrupt_dir(self) -> Path:
        return self.dir.parent / f"{self.dir.name}_corrupt"

    def _set_aside(self, step: int) -> Path:
        """Move step's folder to checkpoints_corrupt/<step>[.n] (kept for inspection; a new
        checkpoint of that step is written when the run reaches it again)."""
        target, n = self.corrupt_dir / str(step), 0
        while target.exists():
            n += 1
            target = self.corrupt_dir / f"{step}.{n}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(self.dir / str(step)), str(target))
        return target

    def close(self) -> None:
        self.manager.close()
