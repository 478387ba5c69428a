"""Orbax checkpoints of the whole loop state: parameters, optimizer, step, data position and
the rewarder's host-side state (e.g. the rubric memory), so a resumed run
continues exactly.

Every checkpoint carries its own integrity record in its metadata: the SHA-256 of every
saved array's bytes (with its dtype and shape) and of the rest of the metadata (the rubric
memory / reward state, data position, step, settings). :meth:`Checkpointer.restore_verified`
recomputes them on the restored values; :meth:`Checkpointer.restore_latest_valid` walks back
from the newest checkpoint to the newest one that restores and verifies, setting the broken
ones aside (``checkpoints_corrupt/``), never deleting them.

In a job of several processes (a ``rl.run.multihost.Exchange`` given) an array spread over hosts
is checksummed shard by shard: each process digests the shards it holds, the checkpoint
records every process's digests, and on restore each process verifies the shards it holds.
Each shard also gets a layout-free sum (:func:`shard_sum`): added over the distinct shards of
any layout they give the same total, so a job resumed under another mesh shape, whose shards
cover other slices than those saved, is still verified whole.
Process 0 lists the checkpoints and the processes decide together: a checkpoint is used only
when it verifies on every process, and only process 0 moves a broken one aside.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from rl.run.folder import is_url, move_folder

log = logging.getLogger(__name__)

INTEGRITY = "integrity"  # the metadata entry holding the checksums


class CheckpointError(RuntimeError):
    """No checkpoint of a run folder can be restored."""


class CorruptCheckpoint(CheckpointError):
    """One checkpoint is incomplete or its bytes differ from what was saved."""


def _sha256(a: np.ndarray) -> str:
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype}{a.shape}".encode())
    h.update(a.reshape(-1).view(np.uint8).tobytes())
    return h.hexdigest()


def array_digest(x: Any) -> str | dict[str, str]:
    """SHA-256 over an array's dtype, shape and bytes; for an array spread over several hosts,
    which one process cannot read whole, {shard index: SHA-256} of the shards this process
    holds (:func:`shard_digests`)."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return shard_digests(x)
    return _sha256(np.asarray(jax.device_get(x)))


def _distinct_shards(x: jax.Array) -> dict[str, Any]:
    """{index: shard} of the shards of `x` this process holds, one per distinct index
    (``"0:64,0:128"``: the slice of the whole array each covers; replicas dropped)."""
    out: dict[str, Any] = {}
    for shard in x.addressable_shards:
        out.setdefault(_index_key(shard.index, x.shape), shard)
    return out


def shard_digests(x: jax.Array) -> dict[str, str]:
    """{index: SHA-256} of the distinct shards of `x` this process holds."""
    return {key: _sha256(np.asarray(shard.data))
            for key, shard in _distinct_shards(x).items()}


def _index_key(index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    return ",".join(f"{s.start or 0}:{n if s.stop is None else s.stop}"
                    for s, n in zip(index, shape))


def _mix32(h: np.ndarray) -> np.ndarray:
    """lowbias32 (C. Wellons' integer hash): an invertible mixing of uint32 values."""
    h = h ^ (h >> 16)
    h = h * np.uint32(0x7FEB352D)
    h = h ^ (h >> 15)
    h = h * np.uint32(0x846CA68B)
    return h ^ (h >> 16)


def _bits32(a: np.ndarray) -> np.ndarray:
    """Each element's bytes as one uint32 (narrower elements widened, 8-byte ones folded)."""
    a = np.ascontiguousarray(a)
    if a.dtype.itemsize == 8:
        halves = a.view(np.uint32).reshape(*a.shape, 2)
        return halves[..., 0] ^ _mix32(halves[..., 1])
    return a.view({4: np.uint32, 2: np.uint16, 1: np.uint8}[a.dtype.itemsize]).astype(np.uint32)


def _flat_positions(start: list[int], extent: tuple[int, ...], shape: tuple[int, ...]
                    ) -> np.ndarray:
    """The row-major position in the whole array of each element of the block at `start`
    (mod 2**32)."""
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    pos = np.zeros((), np.uint64)
    for s, n, stride in zip(start, extent, strides):
        pos = pos[..., None] + np.arange(s, s + n, dtype=np.uint64) * np.uint64(stride)
    return pos.astype(np.uint32)


SUM_ROWS = 1 << 22  # elements per piece of a shard summed at once (bounds the temporaries)


def shard_sum(block: np.ndarray, index: tuple[slice, ...], shape: tuple[int, ...]) -> str:
    """A layout-free checksum of one shard of an array of `shape`: two 32-bit lanes, each
    sum_i mix(bits_i, i) mod 2**32 over the shard's elements, i their positions in the whole
    array. Sums of the distinct shards of any layout add up to the same total, so restored
    shards verify against saved ones cut differently; a changed element changes each lane
    except with probability ~2**-32."""
    start = [s.start or 0 for s in index]
    rows = max(1, SUM_ROWS // max(1, int(np.prod(block.shape[1:], dtype=np.int64))))
    lanes = [0, 0]
    for r in range(0, max(1, block.shape[0]) if block.ndim else 1, rows):
        piece = block[r:r + rows] if block.ndim else block
        at = _flat_positions([start[0] + r, *start[1:]], piece.shape, shape) if block.ndim \
            else np.zeros((), np.uint32)
        bits = _bits32(piece)
        lanes[0] += int(_mix32(bits + _mix32(at)).sum(dtype=np.uint64))
        lanes[1] += int(_mix32(bits ^ _mix32(at ^ np.uint32(0x9E3779B9))).sum(dtype=np.uint64))
    return "".join(f"{lane % 2**32:08x}" for lane in lanes)


def add_sums(sums: Any) -> str:
    """The total of shard sums (:func:`shard_sum`), lane by lane."""
    lanes = [0, 0]
    for s in sums:
        lanes = [lanes[0] + int(s[:8], 16), lanes[1] + int(s[8:], 16)]
    return "".join(f"{lane % 2**32:08x}" for lane in lanes)


def shard_sums(x: jax.Array) -> dict[str, str]:
    """{index: shard_sum} of the distinct shards of `x` this process holds."""
    return {key: shard_sum(np.asarray(shard.data), shard.index, x.shape)
            for key, shard in _distinct_shards(x).items()}


def spread_sums(tree: Any) -> dict[str, dict[str, str]]:
    """{path: shard_sums} for the leaves of `tree` spread over several hosts."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): shard_sums(leaf) for path, leaf in leaves
            if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable}


def tree_digests(tree: Any) -> dict[str, Any]:
    """{path in the tree: array_digest} for every leaf."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): array_digest(leaf) for path, leaf in leaves}


def job_digests(tree: Any, exchange: Any = None) -> dict[str, Any]:
    """What a checkpoint records of `tree`'s arrays: :func:`tree_digests`, the shard digests
    of a spread array as {"shards": {process index: {index: SHA-256}}, "sums": {index:
    shard_sum}}, every process's (gathered through `exchange`; this process's alone without
    one)."""
    mine, sums = tree_digests(tree), spread_sums(tree)
    spread = {k: (v, sums[k]) for k, v in mine.items() if isinstance(v, dict)}
    hosts = ({jax.process_index(): spread} if exchange is None or not spread
             else dict(enumerate(exchange.gather(spread, "shard checksums"))))
    return {k: ({"shards": {str(p): h[k][0] for p, h in hosts.items() if k in h},
                 "sums": {i: s for h in hosts.values() if k in h for i, s in h[k][1].items()}}
                if isinstance(v, dict) else v) for k, v in mine.items()}


def json_digest(obj: Any) -> str:
    """SHA-256 of a JSON value as it is saved (keys sorted; tuples and lists alike)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def with_integrity(tree: Any, meta: dict[str, Any], exchange: Any = None) -> dict[str, Any]:
    """`meta` plus the checksums of `tree`'s arrays (:func:`job_digests`) and of `meta`."""
    return {**meta, INTEGRITY: {"algorithm": "sha256", "arrays": job_digests(tree, exchange),
                                "meta": json_digest(meta)}}


def integrity_problems(tree: Any, meta: dict[str, Any]) -> list[str]:
    """What differs between restored values and the checksums saved with them (empty: all
    agree). A spread array is compared shard by shard where this process holds a shard whose
    index a saved digest covers (this process's own record first); a checkpoint of an older
    version recorded None for it and is not compared there."""
    saved = meta[INTEGRITY]
    rest = {k: v for k, v in meta.items() if k != INTEGRITY}
    problems = [] if json_digest(rest) == saved["meta"] else [
        "its metadata (reward state / rubric memory, data position) fails its checksum"]
    now = tree_digests(tree)
    for key, digest in saved["arrays"].items():
        if key not in now:
            problems.append(f"array {key} is missing")
        elif isinstance(digest, dict):
            problems += _shard_problems(key, digest["shards"], now[key])
        elif digest is not None and isinstance(now[key], str) and digest != now[key]:
            problems.append(f"array {key} fails its checksum")
    return problems


def layout_free_problems(tree: Any, meta: dict[str, Any], exchange: Any = None) -> list[str]:
    """The spread arrays of `tree` whose shards, gathered from every process and cut however
    this job's mesh cuts them, do not add up to the layout-free total saved (:func:`shard_sum`).
    Every process of a job calls it together (one gather); the verdict is the same on all."""
    mine = spread_sums(tree)
    if not mine:
        return []
    hosts = [mine] if exchange is None else exchange.gather(mine, "layout-free checksums")
    problems = []
    for key, digest in meta.get(INTEGRITY, {}).get("arrays", {}).items():
        if key in mine and isinstance(digest, dict) and "sums" in digest:
            now = {i: s for h in hosts for i, s in h[key].items()}
            if add_sums(now.values()) != add_sums(digest["sums"].values()):
                problems.append(f"array {key} fails its checksum over the shards of every "
                                f"process")
    return problems


def _shard_problems(key: str, saved: dict[str, dict[str, str]], now: Any) -> list[str]:
    if not isinstance(now, dict):  # restored whole onto one host: no shard to compare
        return []
    mine = str(jax.process_index())
    order = [mine] + [p for p in saved if p != mine]
    bad = []
    for index, digest in now.items():
        want = next((saved[p][index] for p in order if index in saved.get(p, {})), None)
        if want is not None and want != digest:
            bad.append(index)
    return [f"array {key} fails its checksum on process {mine} (shard(s) "
            f"{'; '.join(bad)})"] if bad else []


class Checkpointer:
    def __init__(self, directory: str | Path | epath.Path, keep: int | None = 2,
                 exchange: Any = None):
        """`keep`: how many of the newest checkpoints stay (None: all). `exchange`: the job's
        ``rl.run.multihost.Exchange`` when it has several processes."""
        self.dir = (epath.Path(directory) if is_url(directory)
                    else epath.Path(directory).expanduser().absolute())
        self.exchange = exchange
        self.manager = ocp.CheckpointManager(
            self.dir, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

    @property
    def leader(self) -> bool:
        """The process that lists, moves and deletes checkpoint folders (process 0)."""
        return self.exchange is None or self.exchange.rank == 0

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def step_dirs(self) -> list[int]:
        """Steps with a folder here, newest first: those orbax lists and integer-named folders
        it does not (emptied or never finalised). In a job, process 0's list, on every
        process."""
        def listed() -> list[int]:
            # (on object storage the folder exists only once something is written in it)
            on_disk = {int(p.name) for p in self.dir.iterdir()
                       if p.is_dir() and p.name.isdigit()} if self.dir.exists() else set()
            return sorted(on_disk | set(self.manager.all_steps()), reverse=True)

        if self.exchange is None:
            return listed()
        return self.exchange.from_leader(listed, "process 0's list of checkpoints")

    def save(self, step: int, tree: Any, meta: dict[str, Any]) -> None:
        """Save `tree` (a dict of pytrees of arrays) and `meta` (JSON) with their checksums."""
        meta = with_integrity(tree, meta, self.exchange)
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
        is valid (nothing is moved then). In a job a candidate is used only when it verifies
        on every process (each reads and checks its own shards); the reasons name the
        processes."""
        broken: list[tuple[int, str]] = []
        for step in self.step_dirs():
            try:  # the metadata first, on every process, so all restore or none does
                check(step, self._everywhere(self.meta_verified, step))
                state, meta = self._everywhere(self.restore_verified, step, like)
                self._everywhere(self._verify_layout_free, step, state, meta)
            except CorruptCheckpoint as e:
                broken.append((step, str(e)))
                continue
            if broken:
                self._fall_back(step, broken)
            return step, state, meta
        raise CheckpointError(f"{self.dir}: no valid checkpoint to resume from: " + "; ".join(
            reason for _, reason in broken))

    def _verify_layout_free(self, step: int, state: Any, meta: dict[str, Any]) -> None:
        """The spread arrays checked whole, under whatever layout they were restored to
        (after every process restored: :func:`layout_free_problems` gathers from all)."""
        if problems := layout_free_problems(state, meta, self.exchange):
            raise CorruptCheckpoint(f"step {step} ({self.dir / str(step)}): "
                                    f"{'; '.join(problems)}")

    def _everywhere(self, attempt: Callable[..., Any], *args: Any) -> Any:
        """`attempt(*args)`'s value when it succeeds on every process of the job, else
        CorruptCheckpoint on every process with each failing process's reason."""
        try:
            value, problem = attempt(*args), None
        except CorruptCheckpoint as e:
            value, problem = None, str(e)
        if self.exchange is not None:
            problems = self.exchange.gather(problem, "checkpoint verdict")
            failed = [(i, p) for i, p in enumerate(problems) if p is not None]
            if failed:
                raise CorruptCheckpoint("; ".join(
                    p if len(problems) == 1 else f"process {i}: {p}" for i, p in failed))
        elif problem is not None:
            raise CorruptCheckpoint(problem)
        return value

    def _fall_back(self, step: int, broken: list[tuple[int, str]]) -> None:
        newest = broken[0][0]
        log.warning("checkpoint(s) %s not usable: %s. Resuming from step %d instead: steps "
                    "%d-%d (%d) are trained again; the broken ones are moved to %s",
                    ", ".join(str(s) for s, _ in broken), "; ".join(r for _, r in broken),
                    step, step, newest - 1, newest - step, self.corrupt_dir)
        if self.leader:
            for s, _ in broken:
                self._set_aside(s)
        if self.exchange is not None:  # the others list the folder only once it has moved
            self.exchange.gather(True, "move of the broken checkpoints")
        self.manager.reload()

    @property
    def corrupt_dir(self) -> epath.Path:
        return self.dir.parent / f"{self.dir.name}_corrupt"

    def _set_aside(self, step: int) -> epath.Path:
        """Move step's folder to checkpoints_corrupt/<step>[.n] (kept for inspection; a new
        checkpoint of that step is written when the run reaches it again)."""
        target, n = self.corrupt_dir / str(step), 0
        while target.exists():
            n += 1
            target = self.corrupt_dir / f"{step}.{n}"
        move_folder(self.dir / str(step), target)
        return target

    def close(self) -> None:
        self.manager.close()
