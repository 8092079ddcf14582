"""A reward function that starts a subprocess and then times out leaves nothing running
(issue 22 §4): the worker's whole process group is SIGKILLed. Real worker processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from baton.rewards.runner import RewardRunner, register_reward


@register_reward("test/spawns_then_hangs")
def _spawns_then_hangs(prompt, completion, **row):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(completion, "a") as f:
        f.write(f"{child.pid}\n")
    time.sleep(600)
    return 1.0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_timed_out_reward_leaves_no_subprocess(tmp_path):
    files = [str(tmp_path / f"pids{i}") for i in range(4)]
    runner = RewardRunner({"test/spawns_then_hangs": 1.0}, timeout_s=3.0, max_workers=4)
    try:
        totals, _, stats = runner.score(["p"] * 4, files, [{}] * 4)
        assert stats.timeouts == [1] * 4 and totals == [0.0] * 4
        pids = [int(x) for f in files if os.path.exists(f) for x in Path(f).read_text().split()]
        assert pids, "no reward call got as far as starting its subprocess"
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [p for p in pids if _alive(p)] == [], "orphaned reward subprocesses"
    finally:
        runner.close()
        for f in files:
            for x in (Path(f).read_text().split() if os.path.exists(f) else []):
                try:
                    os.kill(int(x), 9)
                except ProcessLookupError:
                    pass
