"""Joining a multi-process job: TPU pod slices, GPU clusters, several CPU processes.

    job = join_cluster(coordinator, num_processes, process_id, connect_timeout_s=300)

The same command runs on every host. Where the job comes from, first match wins:

1. explicit settings: ``mesh.coordinator`` (host:port of process 0), ``mesh.num_processes``,
   ``mesh.process_id``, or the environment variable ``JAX_COORDINATOR_ADDRESS``;
2. the cluster JAX's own ``jax.distributed.initialize()`` finds by itself
   (:func:`detect_cluster`): a Cloud TPU VM slice (GCE or GKE), SLURM, Open MPI, Kubernetes;
3. nothing: one process (a cluster of one process, e.g. ``srun -n 1``, also stays one).

Must run before any other JAX call. CPU processes exchange their collectives over gloo.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import Any

import jax

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ClusterJob:
    """A job as this process joins it: who found it, process 0's address, the size, our rank."""

    found_by: str  # "mesh.coordinator", "JAX_COORDINATOR_ADDRESS", or JAX's cluster name
    coordinator: str | None  # None: left to JAX (TPU_WORKER_HOSTNAMES)
    num_processes: int | None
    process_id: int | None


def detect_cluster(timeout_s: int = 300) -> ClusterJob | None:
    """The job ``jax.distributed.initialize()`` would join with no arguments, or None.

    Asks JAX's cluster environments in JAX's own order, as
    ``ClusterEnv.auto_detect_unset_distributed_params`` does: a Cloud TPU VM slice (GCE
    metadata, or GKE's ``TPU_WORKER_HOSTNAMES``), SLURM (``SLURM_JOB_ID``, ``SLURM_NTASKS``,
    ``SLURM_PROCID``, ``SLURM_LOCALID``, ``SLURM_STEP_NODELIST``), Open MPI
    (``OMPI_MCA_orte_hnp_uri``), Kubernetes (with the ``kubernetes`` package); mpi4py only
    when asked for, so never here. ``JAX_COORDINATOR_PORT`` overrides the port JAX derives.
    The environments live in a private JAX module (``jax._src.clusters``): if it moves, this
    finds nothing and says so, and jobs need ``mesh.coordinator`` or
    ``JAX_COORDINATOR_ADDRESS``."""
    try:
        from jax._src.clusters import ClusterEnv

        env = next((e for e in ClusterEnv._cluster_types
                    if not e.opt_in_only_method and e.is_env_present()), None)
        if env is None:
            return None
        port = os.environ.get("JAX_COORDINATOR_PORT")
        return ClusterJob(env.name or env.__name__,
                          env.get_coordinator_address(timeout_secs=timeout_s,
                                                      override_coordinator_port=port),
                          env.get_process_count(), env.get_process_id())
    except (ImportError, AttributeError, TypeError) as e:
        log.warning("JAX's cluster detection is not available in jax %s (%s): a multi-process "
                    "job needs mesh.coordinator or JAX_COORDINATOR_ADDRESS", jax.__version__, e)
        return None


def job_settings(coordinator: str | None, num_processes: int | None, process_id: int | None,
                 connect_timeout_s: int = 300) -> ClusterJob | None:
    """The job to join (module docstring's order), or None for a single process.
    ValueError naming the ``mesh.*`` key on inconsistent settings."""
    if coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS"):
        job = ClusterJob("mesh.coordinator" if coordinator else "JAX_COORDINATOR_ADDRESS",
                         coordinator or os.environ["JAX_COORDINATOR_ADDRESS"], num_processes,
                         process_id)
    elif (found := detect_cluster(connect_timeout_s)) is not None and (
            (found.num_processes or 1) > 1 or num_processes not in (None, 1)):
        job = ClusterJob(found.found_by, found.coordinator,
                         found.num_processes if num_processes is None else num_processes,
                         found.process_id if process_id is None else process_id)
    elif os.environ.get("TPU_WORKER_HOSTNAMES") is not None:
        job = ClusterJob("TPU_WORKER_HOSTNAMES", None, num_processes, process_id)
    elif num_processes not in (None, 1) or process_id not in (None, 0):
        raise ValueError(f"mesh.coordinator: mesh.num_processes={num_processes} / "
                         f"mesh.process_id={process_id} need a coordinator address "
                         f"(host:port of process 0), none is set and JAX found no cluster")
    else:
        return None
    _check_process_ids(job.coordinator, job.num_processes, job.process_id)
    return job


def join_cluster(coordinator: str | None = None, num_processes: int | None = None,
                 process_id: int | None = None, connect_timeout_s: int = 300,
                 heartbeat_timeout_s: int = 60,
                 local_device_ids: list[int] | None = None) -> ClusterJob | None:
    """Join the job :func:`job_settings` finds (a no-op for a single process, or when this
    process has joined one already); returns it. `local_device_ids`: the devices this process
    uses (``core.local_devices``; None: JAX's choice, one GPU per local rank in a SLURM or
    Open MPI job).

    `connect_timeout_s` bounds the wait for the coordinator and the other processes; a
    process that stops sending heartbeats for `heartbeat_timeout_s` ends the job on every
    process, with an error naming it, instead of leaving the others blocked in a collective;
    so does a process that stops on an error (its shutdown waits as long). ValueError
    (naming the ``mesh.*`` key) on inconsistent settings, before connecting; RuntimeError
    naming the address and where it came from when the job cannot be joined.
    """
    if jax.distributed.is_initialized():
        return None
    job = job_settings(coordinator, num_processes, process_id, connect_timeout_s)
    if job is None:
        return None
    # a process that stops on an error waits for the others at the shutdown barrier while they
    # wait for it in a collective: the same bound as a silent process ends that wait
    kw: dict[str, Any] = {"initialization_timeout": int(connect_timeout_s),
                          "heartbeat_timeout_seconds": int(heartbeat_timeout_s),
                          "shutdown_timeout_seconds": int(heartbeat_timeout_s)}
    if job.coordinator:
        kw["coordinator_address"] = job.coordinator
    if job.num_processes is not None:
        kw["num_processes"] = job.num_processes
    if job.process_id is not None:
        kw["process_id"] = job.process_id
    if local_device_ids is not None:
        kw["local_device_ids"] = list(local_device_ids)
    if job.coordinator and job.process_id:  # process 0 serves the coordinator
        _wait_for_coordinator(job, connect_timeout_s)
    log.info("joining the job at %s (found by %s) as process %s of %s with local devices %s; "
             "waiting up to mesh.connect_timeout_s=%s s for the others", job.coordinator,
             job.found_by, job.process_id, job.num_processes,
             "JAX's choice" if local_device_ids is None else local_device_ids, connect_timeout_s)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(**kw)
    except Exception as e:  # XlaRuntimeError: deadline exceeded, connection refused, ...
        raise RuntimeError(
            f"{_source(job)}: could not join the job at {job.coordinator!r} as process "
            f"{job.process_id} of {job.num_processes} within mesh.connect_timeout_s="
            f"{connect_timeout_s}: {type(e).__name__}: {e}") from None
    log.info("jax.distributed: process %d of %d", jax.process_index(), jax.process_count())
    return job


def _source(job: ClusterJob) -> str:
    """What to name in an error: the setting, or JAX's cluster detection."""
    if job.found_by in ("mesh.coordinator", "JAX_COORDINATOR_ADDRESS", "TPU_WORKER_HOSTNAMES"):
        return job.found_by
    return (f"mesh.coordinator (unset: the {job.found_by} job JAX found in the environment; "
            f"set mesh.coordinator or JAX_COORDINATOR_ADDRESS to choose another)")


def _wait_for_coordinator(job: ClusterJob, timeout_s: float) -> None:
    """Return once something listens at the job's coordinator (host:port); RuntimeError
    naming it after `timeout_s`. (JAX's own connect timeout aborts the process without
    saying which setting is wrong.)"""
    host, _, port = (job.coordinator or "").rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                return
        except OSError as e:
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{_source(job)}: nothing answers at {job.coordinator} after {timeout_s} s "
                    f"(mesh.connect_timeout_s): {e}. Is process 0 running, and is that "
                    f"address reachable from this host?") from None
            time.sleep(0.5)


def _check_process_ids(coordinator: str | None, num_processes: int | None,
                       process_id: int | None) -> None:
    if coordinator and ":" not in coordinator:
        raise ValueError(f"mesh.coordinator: {coordinator!r} is not host:port")
    if (num_processes is None) != (process_id is None):
        raise ValueError("mesh.num_processes / mesh.process_id: set both or neither "
                         f"(got {num_processes} / {process_id})")
    if num_processes is not None and num_processes < 1:
        raise ValueError(f"mesh.num_processes: must be >= 1, got {num_processes}")
    if process_id is not None and num_processes is not None and not (
            0 <= process_id < num_processes):
        raise ValueError(f"mesh.process_id: must be in [0, mesh.num_processes="
                         f"{num_processes}), got {process_id}")
