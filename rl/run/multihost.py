"""The host side of a multi-process (multi-controller) job: one value, one request, one writer.

JAX runs the same program in every process; the device work (rollout, reference pass, update)
is one SPMD program over the job's devices, each process computing its rows. The host work
(texts, environments, rewards, the rubric memory) runs in every process on the same values:
the sampler's outputs are gathered whole to every host (``models.sharding.host_copy``), so
every process holds the same groups and makes the same calls in the same order. Three rules
keep it one run instead of N:

- **Outside services are called once.** A judge or a retriever is wrapped in
  :class:`LeaderCalls`: process 0 makes each call and passes its result (or its error) to
  the others through the coordinator's key-value store (:class:`Exchange`). A judge server
  sees every request once, whatever the number of processes.
- **The host state is checked every step.** :meth:`Exchange.agree` compares a digest of the
  rewarder state (the rubric memory), the data position and the step across processes; a
  difference is a :class:`DivergenceError` naming the step and the processes.
- **Process 0 writes the run folder** (``rl.run.runlog.RunLog(active=...)``); checkpoints are
  written by every process together (orbax), each its shards.

A process that dies stops sending heartbeats; the coordination service then ends every other
process with an error naming it (``mesh.heartbeat_timeout_s``), and a wait for another
process's value is bounded by ``mesh.wait_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import functools
import pickle
from collections.abc import Callable
from typing import Any

import jax

KEY_ROOT = "rl_exchange"


class DivergenceError(RuntimeError):
    """The processes of a job hold different host values where they must hold the same."""


def is_leader() -> bool:
    """Process 0: the one that calls outside services and writes the run folder."""
    return jax.process_index() == 0


def _portable(error: BaseException) -> BaseException:
    """`error` if it pickles (so the other processes raise the same type), else a
    RuntimeError carrying its type and message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


class Exchange:
    """Host values passed between the processes of one job, in call order.

    Every process makes the same sequence of calls (they run the same program on the same
    values); the n-th call of each process is the same exchange, keyed ``n`` in the JAX
    coordinator's key-value store. Keys are deleted by process 0 once every process has
    passed them (at the next :meth:`agree`), so the store does not grow with the run."""

    def __init__(self, wait_timeout_s: int, client: Any = None, prefix: str = KEY_ROOT):
        if client is None:
            from jax._src import distributed  # the client jax.distributed.initialize made

            client = distributed.global_state.client
        if client is None:
            raise RuntimeError("rl.run.multihost.Exchange: jax.distributed is not initialised")
        self._client = client
        self._timeout_ms = int(wait_timeout_s * 1000)
        self._wait_timeout_s = wait_timeout_s
        self._prefix = prefix  # keys of another exchange in the same job stay apart
        self._next = 0
        self._written: list[str] = []  # process 0's values since the last agree
        self._stale: list[str] = []  # the last agree's digests
        self.rank, self.size = jax.process_index(), jax.process_count()
        self.exchanges = 0  # how many values passed (a counter for the run's metrics)

    def _key(self) -> str:
        key = f"{self._prefix}/{self._next}"
        self._next += 1
        self.exchanges += 1
        return key

    def _get(self, key: str, what: str) -> bytes:
        try:
            return self._client.blocking_key_value_get_bytes(key, self._timeout_ms)
        except Exception as e:  # DEADLINE_EXCEEDED from the coordinator
            raise TimeoutError(
                f"mesh.wait_timeout_s: process {self.rank} waited {self._wait_timeout_s} s "
                f"for {what} (exchange {key}): {type(e).__name__}: {e}") from None

    def from_leader(self, produce: Callable[[], Any], what: str = "process 0's value") -> Any:
        """``produce()`` run on process 0; its value (or the error it raised) on every
        process. The value must pickle."""
        key = self._key()
        if self.rank == 0:
            try:
                outcome: tuple[bool, Any] = (True, produce())
            except Exception as e:
                outcome = (False, _portable(e))
            self._client.key_value_set_bytes(key, pickle.dumps(outcome))
            self._written.append(key)
        else:
            outcome = pickle.loads(self._get(key, what))
        ok, value = outcome
        if not ok:
            raise value
        return value

    def gather(self, value: Any, what: str) -> list[Any]:
        """Every process posts `value` (it must pickle); each gets all of them, by process
        index. `what` names the value in a timeout's message."""
        key = self._key()
        self._client.key_value_set_bytes(f"{key}/{self.rank}", pickle.dumps(value))
        values = [pickle.loads(self._get(f"{key}/{i}", f"process {i}'s {what}"))
                  for i in range(self.size)]
        if self.rank == 0:  # everyone has posted here, so has passed every earlier exchange:
            # forget those (this gather's own keys next time: the others may still read them)
            for old in self._stale + self._written:
                self._client.key_value_delete(old)
            self._stale, self._written = [f"{key}/{i}" for i in range(self.size)], []
        return values

    def agree(self, digest: str, what: str) -> None:
        """Every process posts `digest`; each compares all of them. DivergenceError naming
        `what` and the processes when they differ."""
        theirs = self.gather(digest, f"digest of {what}")
        if len(set(theirs)) > 1:
            differ = [i for i, d in enumerate(theirs) if d != theirs[0]]
            raise DivergenceError(
                f"{what} differs between the processes of the job: process 0 has "
                f"{theirs[0][:12]}, processes {differ} have "
                f"{', '.join(theirs[i][:12] for i in differ)}. They ran the same program on "
                f"values that should be equal: a host computation (e.g. an embedding on "
                f"different CPUs) or a local file differs between hosts")


class LeaderCalls:
    """A service (a judge, a retriever) that only process 0 talks to: each method call runs
    there and its result, or its error, reaches every process (:meth:`Exchange.from_leader`).
    Attributes that are not methods are read locally (every process built the same service
    from the same config). Every process must make the same calls in the same order, which
    holds when they run the same program on the same values (:meth:`Exchange.agree` checks
    the host state every step)."""

    def __init__(self, service: Any, exchange: Exchange, name: str):
        self._service, self._exchange, self._name = service, exchange, name

    @property
    def inner(self) -> Any:
        """The wrapped service (process 0's is the one that is called)."""
        return self._service

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._service, attr)
        if not callable(value):
            return value

        @functools.wraps(value)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._exchange.from_leader(lambda: value(*args, **kwargs),
                                              f"process 0's {self._name}.{attr} reply")

        return call


def shared(service: Any, exchange: Exchange | None, name: str) -> Any:
    """`service` called by process 0 only (:class:`LeaderCalls`) in a multi-process job;
    itself otherwise (and when it is None)."""
    if service is None or exchange is None:
        return service
    return LeaderCalls(service, exchange, name)


def shared_env(env: Any, exchange: Exchange | None) -> Any:
    """The environment with its ``retriever`` (when it has one) called by process 0 only."""
    retriever = getattr(env, "retriever", None)
    if exchange is None or retriever is None or isinstance(retriever, LeaderCalls):
        return env
    return dataclasses.replace(env, retriever=LeaderCalls(retriever, exchange, "retriever"))
