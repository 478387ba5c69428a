"""Orbax checkpoints of the whole training state: parameters, optimizer, step, RNG, data
position and the rewarder's host-side state (e.g. the rubric memory), so a resumed run
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
        """Restore onto the structure, dtypes and shardings of `like` (a pytree of arrays)."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"])

    def close(self) -> None:
        self.manager.close()
