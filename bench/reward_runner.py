"""Benchmark: what `RewardRunner.score()` costs on a batch of a cheap verifier, old vs new.

    OMP_NUM_THREADS=1 .venv/bin/python bench/reward_runner.py [--rows 512 --iters 30 --workers 4]

Scores --rows arithmetic rows with `arithmetic/correct` (a string compare: the work is
~nothing, so what is timed is the runner's overhead), then with both arithmetic functions.
Rows (median ms per score() over --iters calls, after warm-up calls that also wait for the
worker processes to start):
  * old threads: the thread-pool runner this replaced (copied below, unchanged): one
    future per call, one deadline per column;
  * new process: the default sandbox, worker processes fed in chunks;
  * new thread: the in-process sandbox (daemon threads, same chunking);
  * plain loop: calling the function in a Python loop (the floor: no deadline at all).
The ratio column is each row over "old threads".

    OMP_NUM_THREADS=1 .venv/bin/python bench/reward_runner.py --hung [--hang-s 40]

instead scores 128 rows of which 4 (spread out) hang for --hang-s, with timeout_s=1, and
prints each runner's timeouts, wrong scores and wall time (the old runner then holds the
process for the rest of the hang at exit: its threads are joined).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import logging
import time

import baton.envs  # noqa: F401  (registers arithmetic/correct and arithmetic/format)
from baton.envs.arithmetic import ArithmeticTask
from baton.rewards.runner import RewardRunner, resolve_reward
from _common import add_smoke  # bench/_common.py
from _timing import median_ms  # bench/_timing.py (scripts run from bench/ on sys.path)


class OldThreadRunner:
    """baton.rewards.runner.RewardRunner before per-call deadlines (git 4af45e1), unchanged
    except for failure handling, which the benchmark does not exercise."""

    def __init__(self, functions: dict[str, float], timeout_s: float = 5.0, max_workers: int = 4):
        self.fns = {name: (resolve_reward(name), float(w)) for name, w in functions.items()}
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._pool = cf.ThreadPoolExecutor(max_workers, thread_name_prefix="reward")

    def score(self, prompts, completions, rows):
        per_fn = {}
        for name, (fn, _) in self.fns.items():
            futures = [self._pool.submit(fn, p, c, **r) for p, c, r in zip(prompts, completions, rows)]
            waves = -(-len(futures) // self.max_workers)
            _, late = cf.wait(futures, timeout=self.timeout_s * max(waves, 1))
            per_fn[name] = [0.0 if f in late else float(f.result(timeout=0)) for f in futures]
        totals = [sum(w * per_fn[name][i] for name, (_, w) in self.fns.items()) for i in range(len(prompts))]
        return totals, per_fn, None

    def close(self):
        self._pool.shutdown(wait=True)


HANG_S = 40.0


def hang(prompt, completion, **row):
    """A verifier that hangs on some samples (resolved as 'reward_runner:hang', so that
    worker processes import it from this file's directory)."""
    if completion == "hang":
        time.sleep(HANG_S)
    return 1.0


def hung(a) -> None:
    import reward_runner  # this file as an importable module (worker processes need one)
    reward_runner.HANG_S = a.hang_s
    n = 128
    completions = ["hang" if i % (n // 4) == n // 8 else "ok" for i in range(n)]
    print(f"{n} rows, 4 hang for {a.hang_s:g}s, timeout_s=1, {a.workers} workers")
    print(f"{'runner':<14}{'timeouts':>10}{'wrong':>8}{'wall s':>9}")
    for name, make in (("new process", lambda: RewardRunner({"reward_runner:hang": 1.0}, 1.0, a.workers, "process")),
                       ("new thread", lambda: RewardRunner({"reward_runner:hang": 1.0}, 1.0, a.workers, "thread")),
                       ("old threads", lambda: OldThreadRunner({"reward_runner:hang": 1.0}, 1.0, a.workers))):
        runner = make()
        runner.score(["p"], ["ok"], [{}])  # warm-up (worker processes start)
        t0 = time.perf_counter()
        totals, _, stats = runner.score(["p"] * n, completions, [{}] * n)
        wall = time.perf_counter() - t0
        timeouts = sum(stats.timeouts) if stats else sum(t == 0.0 for t in totals)
        wrong = sum(t != float(c == "ok") for t, c in zip(totals, completions))
        print(f"{name:<14}{timeouts:>10}{wrong:>8}{wall:>9.2f}", flush=True)
        if name != "old threads":
            runner.close()


def plain_loop(functions, prompts, completions, rows):
    fns = [(resolve_reward(name), w) for name, w in functions.items()]
    return [sum(w * float(fn(p, c, **r)) for fn, w in fns) for p, c, r in zip(prompts, completions, rows)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--hung", action="store_true", help="the hung-samples scenario instead")
    ap.add_argument("--hang-s", type=float, default=HANG_S)
    add_smoke(ap)
    a = ap.parse_args()
    if a.smoke:
        a.rows, a.iters, a.workers = 12, 1, 2
    logging.basicConfig(level=logging.ERROR)
    if a.hung:
        return hung(a)

    task = ArithmeticTask()
    data = task.train_rows(a.rows, seed=0)
    prompts = [r["prompt"] for r in data]
    completions = [r["answer"] if i % 3 else "0" for i, r in enumerate(data)]  # 2/3 right
    rows = [{"answer": r["answer"]} for r in data]
    args = (prompts, completions, rows)

    print(f"score() on {a.rows} rows, {a.workers} workers; median ms of {a.iters} calls")
    print(f"{'functions':<34}{'runner':<14}{'ms':>9}{'ratio':>8}")
    for functions in ({"arithmetic/correct": 1.0}, {"arithmetic/correct": 1.0, "arithmetic/format": 0.1}):
        expect = plain_loop(functions, *args)
        runners = {"old threads": OldThreadRunner(functions, max_workers=a.workers),
                   "new process": RewardRunner(functions, max_workers=a.workers, sandbox="process"),
                   "new thread": RewardRunner(functions, max_workers=a.workers, sandbox="thread")}
        times = {}
        for name, runner in runners.items():
            assert runner.score(*args)[0] == expect, name
            times[name] = median_ms(lambda: runner.score(*args), a.iters, warmup=3)
            runner.close()
        times["plain loop"] = median_ms(lambda: plain_loop(functions, *args), a.iters, warmup=3)
        label = "+".join(n.split("/")[1] for n in functions)
        for name, ms in times.items():
            print(f"{label:<34}{name:<14}{ms:>9.2f}{ms / times['old threads']:>8.2f}")


if __name__ == "__main__":
    main()
