"""Shared timing helper for the benchmarks."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_ms(fn: Callable[[], object], iters: int, warmup: int = 1) -> float:
    """Median wall time of fn() in milliseconds over `iters` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)
