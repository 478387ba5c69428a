"""Orbax checkpoints of the whole loop state: parameters, optimizer, step, data position and
the rewarder's host-side state (e.g. the rubric memory), so a resumed run
continues exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(RuntimeError):
    pass


class Checkpointer:
    def __init__(self, directory: str | Path, keep: int = 2):
        self.dir = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.dir, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
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
        try:
            return self._restore(step, like)
        except ValueError as e:
            if "rng:" not in str(e) or "rng" in like:
                raise
        state, meta = self._restore(step, {**like, "rng": jax.random.key_data(jax.random.key(0))})
        return {k: v for k, v in state.items() if k != "rng"}, meta

    def _restore(self, step: int, like: Any) -> tuple[Any, dict[str, Any]]:
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self.manager.close()
