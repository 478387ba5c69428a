"""Which GPUs of its node each process of a job uses (``mesh.local_device_ids``), and a check
that none of the node's GPUs is left idle.

Finding a SLURM or Open MPI job, JAX gives each process the one GPU numbered by its local rank
(``SLURM_LOCALID``), which fits one launch style of three:

1. one process per node that sees all the node's GPUs (``srun --ntasks-per-node=1
   --gpus-per-node=8``): it should use all 8; JAX's choice uses 1 and leaves 7 idle;
2. one process per GPU, each seeing all of them (``srun --ntasks-per-node=8
   --gpus-per-node=8``): process k uses GPU k, JAX's choice;
3. one process per GPU, each bound to its own (``--gpus-per-task=1``, or GPUs bound per task
   by cgroups): each sees one GPU, numbered 0; JAX's choice asks process k for a GPU k it
   cannot see.

``auto`` (the default) reads what this process sees and how many processes share its node,
and chooses the devices that cover the node once:

    v = the GPUs this process sees (CUDA_VISIBLE_DEVICES, else SLURM_STEP_GPUS, else
        SLURM_GPUS_ON_NODE), t = the processes on its node (SLURM_STEP_TASKS_PER_NODE /
        SLURM_TASKS_PER_NODE for this node, or Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE),
        r = its local rank (SLURM_LOCALID, OMPI_COMM_WORLD_LOCAL_RANK)
    t = 1           -> all of them: 0 .. v-1                          (style 1)
    v = k t, k >= 1 -> its share: r k .. (r + 1) k - 1                (style 2; k = 1: [r])
    v = 1           -> the one it sees: [0]                           (style 3)
    otherwise       -> an error naming v, t and the key to set

Without a SLURM or Open MPI job, or without GPUs in the environment (a TPU slice, CPU
processes), ``auto`` leaves the choice to JAX. ``jax`` always does; a list (``[0, 1, 2, 3]``)
is used as given. These are device numbers as the process sees them (after
``CUDA_VISIBLE_DEVICES``), the numbers JAX passes to ``jax_cuda_visible_devices``.

At start the job compares the GPUs its node offers (``SLURM_GPUS_ON_NODE``, or the
``SLURM_STEP_GPUS`` list) with those its processes use (each process's devices times the
processes on the node) and stops, naming both, when some would stay idle
(``mesh.allow_idle_devices=true`` proceeds). ``mesh.expect_devices=N`` checks the job's total
once it has formed. All of this reads environment variables only, so it is tested by setting
them on CPU; no GPU cluster has run it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

AUTO, JAX = "auto", "jax"


def _count_list(value: str | None) -> int | None:
    """How many devices a comma list names (``"0,1,2"``; ``"0-3"`` ranges too), None when
    unset; an empty or ``NoDevFiles`` list is 0."""
    if value is None:
        return None
    value = value.strip()
    if not value or value == "NoDevFiles":
        return 0
    n = 0
    for part in value.split(","):
        if m := re.fullmatch(r"\s*(\d+)\s*-\s*(\d+)\s*", part):
            n += int(m.group(2)) - int(m.group(1)) + 1
        elif part.strip():
            n += 1
    return n


def visible_gpus(env: Mapping[str, str]) -> int | None:
    """The GPUs this process sees (module docstring's v), None when nothing says."""
    for key in ("CUDA_VISIBLE_DEVICES", "SLURM_STEP_GPUS"):
        if (n := _count_list(env.get(key))) is not None:
            return n
    return _gpus_on_node(env)


def _gpus_on_node(env: Mapping[str, str]) -> int | None:
    gpus = env.get("SLURM_GPUS_ON_NODE", "").strip()
    return int(gpus) if gpus.isdigit() else None


def node_gpus(env: Mapping[str, str]) -> int | None:
    """The GPUs this process's node offers the job (``SLURM_GPUS_ON_NODE``, else the
    ``SLURM_STEP_GPUS`` list), None outside SLURM or without GPUs."""
    gpus = _gpus_on_node(env)
    return gpus if gpus is not None else _count_list(env.get("SLURM_STEP_GPUS"))


def _task_counts(spec: str) -> list[int] | None:
    """SLURM's tasks-per-node list (``"8(x2),4"`` -> [8, 8, 4]), None when unreadable."""
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def _tasks_of_node(spec: str, node: int) -> int | None:
    """This node's entry of SLURM's tasks-per-node list."""
    counts = _task_counts(spec) or []
    return counts[node] if 0 <= node < len(counts) else None


def processes_per_node(env: Mapping[str, str]) -> int | None:
    """The processes on every node of the job, where the job's own variables say all nodes
    hold as many (SLURM's tasks-per-node list, Open MPI's local size against its world
    size); None otherwise (the mesh then takes each process for a node:
    ``models.device_mesh``). The same on every process of the job, which builds its mesh
    from it."""
    if (size := env.get("OMPI_COMM_WORLD_LOCAL_SIZE")) and size.isdigit():
        world = env.get("OMPI_COMM_WORLD_SIZE", "")
        return int(size) if world.isdigit() and int(world) % int(size) == 0 else None
    for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if key in env:
            counts = _task_counts(env[key]) or []
            return counts[0] if counts and len(set(counts)) == 1 else None
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def tasks_on_node(env: Mapping[str, str]) -> int | None:
    """The processes of the job on this process's node (module docstring's t)."""
    if (size := env.get("OMPI_COMM_WORLD_LOCAL_SIZE")) and size.isdigit():
        return int(size)
    node = int(env.get("SLURM_NODEID", "0") or 0)
    for key in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if key in env and (n := _tasks_of_node(env[key], node)) is not None:
            return n
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    return int(per_node) if per_node.isdigit() else None


def local_rank(env: Mapping[str, str]) -> int | None:
    for key in ("SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"):
        if (r := env.get(key)) is not None and r.isdigit():
            return int(r)
    return None


def in_managed_job(env: Mapping[str, str]) -> bool:
    """A SLURM or Open MPI job: where JAX would choose one GPU per local rank."""
    return "SLURM_JOB_ID" in env or "OMPI_MCA_orte_hnp_uri" in env or (
        "OMPI_COMM_WORLD_LOCAL_RANK" in env)


def local_device_ids(setting: Any, env: Mapping[str, str]) -> list[int] | None:
    """The devices this process uses (module docstring), or None for JAX's choice.
    ValueError naming ``mesh.local_device_ids`` when ``auto`` cannot tell."""
    if setting in (None, JAX):
        return None
    if setting != AUTO:
        ids = [int(i) for i in (setting if isinstance(setting, Sequence) else [setting])]
        if not ids or min(ids) < 0 or len(set(ids)) != len(ids):
            raise ValueError(f"mesh.local_device_ids: expected distinct device numbers >= 0, "
                             f"'auto' or 'jax', got {setting!r}")
        return ids
    v, t, r = visible_gpus(env), tasks_on_node(env), local_rank(env)
    if not in_managed_job(env) or not v:
        return None
    if t is None or r is None:
        raise ValueError(f"mesh.local_device_ids=auto: this process sees {v} GPU(s) but the "
                         f"environment does not say how many processes share its node or its "
                         f"local rank; set mesh.local_device_ids=[...] (or 'jax')")
    if t == 1:
        return list(range(v))
    if v % t == 0:
        k = v // t
        return list(range(r * k, (r + 1) * k))
    if v == 1:
        return [0]
    raise ValueError(f"mesh.local_device_ids=auto: {t} processes share this node and this one "
                     f"sees {v} GPUs, which they cannot split evenly; launch one process per "
                     f"node or one per GPU, or set mesh.local_device_ids=[...]")


def idle_gpus(env: Mapping[str, str], used_per_process: int) -> str | None:
    """Why some of this node's GPUs would stay idle with `used_per_process` devices per
    process (None: all used, or nothing to compare with)."""
    offered, t = node_gpus(env), tasks_on_node(env)
    if not offered or t is None:
        return None
    used = used_per_process * t
    if used >= offered:
        return None
    return (f"this node offers {offered} GPUs to the job but its {t} process(es) use "
            f"{used_per_process} each ({used} in all): {offered - used} would stay idle. Launch "
            f"one process per node (it uses all its GPUs) or one per GPU, set "
            f"mesh.local_device_ids, or set mesh.allow_idle_devices=true to proceed")
