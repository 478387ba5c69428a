"""A circuit breaker for clients of outside services (the judge server, the retrieval server).

Without one, a hung service costs every request its full retry schedule: a judge batch of 16
items at 8 in flight, 4 attempts each, took about 8 x ``timeout_s`` per step for as long as the
service hung. With one, a client asks :meth:`CircuitBreaker.allow` before each attempt and
reports how it ended (:meth:`CircuitBreaker.record`):

* closed: attempts go out; ``threshold`` consecutive timeouts open the breaker;
* open: attempts are refused at once (the client fails them fast) for ``cooldown_s``;
* half-open (after the cool-down): exactly one attempt, the probe, goes out, the others are
  refused while it runs; a probe that times out opens the breaker again for another
  ``cooldown_s``, any other outcome (an answer, even an HTTP error) closes it.

A hung service thus costs about one ``timeout_s`` (the first wave, or one probe) per cool-down,
not one per request. Only timeouts count: a service that answers, even with errors, or refuses
connections, is answered quickly and is handled by the client's bounded retries.
``threshold = 0`` turns the breaker off (it never opens). Thread-safe; never sleeps.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BREAKER_STAT_KEYS = ("breaker_opens", "breaker_rejected")


class CircuitBreaker:
    """Counts ``breaker_opens`` (times it opened, re-openings after a failed probe included)
    and ``breaker_rejected`` (attempts refused while open)."""

    def __init__(self, threshold: int, cooldown_s: float,
                 clock: Callable[[], float] = time.monotonic):
        if threshold < 0 or cooldown_s < 0:
            raise ValueError(f"circuit breaker needs threshold >= 0 and cooldown_s >= 0, got "
                             f"{threshold}, {cooldown_s}")
        self.threshold = int(threshold)
        self.cooldown_s = float(cooldown_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._streak = 0  # consecutive timeouts
        self._opened_at: float | None = None  # None: closed
        self._probing = False
        self._opens = 0
        self._rejected = 0

    def allow(self) -> bool:
        """May an attempt go out now? False (counted) while open, or half-open with the probe
        already out."""
        with self._lock:
            if self._opened_at is None:
                return True
            if not self._probing and self._clock() - self._opened_at >= self.cooldown_s:
                self._probing = True  # this attempt is the probe
                return True
            self._rejected += 1
            return False

    def is_open(self) -> bool:
        """Open and still cooling down (a client need not wait out a backoff to be refused)."""
        with self._lock:
            return (self._opened_at is not None
                    and (self._probing or self._clock() - self._opened_at < self.cooldown_s))

    def record(self, timed_out: bool) -> bool:
        """Report how an allowed attempt ended; True when this report opened the breaker (the
        client logs it once, instead of once per refused attempt)."""
        with self._lock:
            if not timed_out:
                self._streak, self._opened_at, self._probing = 0, None, False
                return False
            self._streak += 1
            if self._probing or (self._opened_at is None and self.threshold
                                 and self._streak >= self.threshold):
                self._opened_at, self._probing = self._clock(), False
                self._opens += 1
                return True
            return False

    @property
    def streak(self) -> int:
        """Consecutive timeouts so far."""
        with self._lock:
            return self._streak

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"breaker_opens": self._opens, "breaker_rejected": self._rejected}
