"""Timing that survives this machine's drift (its speed moves 10-20 % over minutes)."""

from __future__ import annotations

import time
from collections.abc import Callable


def alternating_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[float]]:
    """Seconds per call of each function over `repeats` rounds that run them in turn, after one
    warm-up call each (compilation). Timing one side entirely after the other would put the
    drift into the ratio; callers keep each function's best time."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def cpu_name() -> str:
    """The host CPU's model name (``/proc/cpuinfo``; the machine type elsewhere): timings
    and float rounding depend on it, so benchmarks print it."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
