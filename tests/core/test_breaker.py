"""core.breaker: closed -> open after N consecutive timeouts -> one probe after the cool-down."""

import threading

import pytest

from core.breaker import CircuitBreaker


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_opens_after_n_consecutive_timeouts_and_refuses_for_the_cooldown():
    clock = Clock()
    b = CircuitBreaker(3, 10.0, clock)
    for _ in range(2):
        assert b.allow()
        b.record(timed_out=True)
    assert b.allow()
    b.record(timed_out=False)  # an answer resets the streak
    for _ in range(3):
        assert b.allow()
        b.record(timed_out=True)
    assert b.is_open()
    assert [b.allow() for _ in range(4)] == [False] * 4
    clock.t += 9.9
    assert not b.allow()
    assert b.stats() == {"breaker_opens": 1, "breaker_rejected": 5}


def test_half_open_lets_exactly_one_probe_through():
    clock = Clock()
    b = CircuitBreaker(1, 5.0, clock)
    b.allow()
    b.record(timed_out=True)
    clock.t += 5.0
    assert [b.allow() for _ in range(3)] == [True, False, False]  # the probe, then refused
    b.record(timed_out=True)  # the probe hangs: open again, for a new cool-down
    assert b.stats()["breaker_opens"] == 2
    clock.t += 4.0
    assert not b.allow()
    clock.t += 1.0
    assert b.allow()
    b.record(timed_out=False)  # the probe got an answer: closed
    assert not b.is_open()
    assert all(b.allow() for _ in range(5))


def test_threshold_zero_never_opens():
    b = CircuitBreaker(0, 5.0)
    for _ in range(50):
        assert b.allow()
        b.record(timed_out=True)
    assert b.stats() == {"breaker_opens": 0, "breaker_rejected": 0}


def test_thread_safe_counts():
    clock = Clock()
    b = CircuitBreaker(1, 1e9, clock)
    b.allow()
    b.record(timed_out=True)

    def hammer():
        for _ in range(1000):
            b.allow()

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b.stats()["breaker_rejected"] == 8000


def test_bad_settings():
    with pytest.raises(ValueError, match="threshold"):
        CircuitBreaker(-1, 1.0)
