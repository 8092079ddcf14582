"""A server has one trainer (issue 22 §3): a second trainer's weight-group set-up against
a server that already has one fails within seconds, in one line naming the server (before:
a silent 120 s wait in the rendezvous). The second trainer is a real process; the server
is a real uvicorn server on 127.0.0.1, joined by the first trainer over gloo."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx

from baton.rollout.remote import RemoteEngine
from baton.sync import BroadcastSync, check_logprob_parity

SECOND_TRAINER = """
import sys, time
from baton.rollout.remote import RemoteEngine
from baton.sync import BroadcastSync
t0 = time.monotonic()
try:
    BroadcastSync([RemoteEngine(sys.argv[1])], timeout_s=120)
except Exception as exc:
    print(f"{time.monotonic() - t0:.2f} {type(exc).__name__}: {exc}")
    sys.exit(3)
"""

FIRST_TRAINER = """
import sys, time
from baton.rollout.remote import RemoteEngine
from baton.sync import BroadcastSync
sync = BroadcastSync([RemoteEngine(sys.argv[1])], timeout_s=60)
print("joined", flush=True)
time.sleep(600)
"""


def test_a_second_trainer_is_told_at_once_that_the_server_has_one(fresh_served, make_tiny_qwen):
    s = fresh_served()
    first = BroadcastSync([RemoteEngine(s.url)], bucket_mb=1, timeout_s=60)
    try:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run([sys.executable, "-c", SECOND_TRAINER, s.url], capture_output=True, text=True,
                              timeout=100, env=env)  # a hang would reach the 120 s rendezvous timeout first
        assert proc.returncode == 3, (proc.stdout, proc.stderr[-2000:])
        seconds, message = proc.stdout.strip().split(" ", 1)
        assert "\n" not in message and s.url in message and "already has a trainer" in message, message
        assert message.startswith("AlreadyHasTrainer"), message  # a ValueError: the trainer does not retry
        assert "(HTTP 409)" in message, message
        assert float(seconds) < 30, seconds  # the rendezvous was not waited for
        # the first trainer still owns the server and syncs as before
        trainer = make_tiny_qwen(1)
        first.push(trainer.named_parameters(), version=1)
        assert check_logprob_parity(RemoteEngine(s.url), trainer, [5, 9, 11]) < 1e-4
    finally:
        first.close()
    # once it has left, another trainer may join
    second = BroadcastSync([RemoteEngine(s.url)], bucket_mb=1, timeout_s=60)
    second.close()


def test_init_while_a_group_exists_is_409(fresh_served):
    s = fresh_served()
    first = BroadcastSync([RemoteEngine(s.url)], bucket_mb=1, timeout_s=60)
    try:
        r = httpx.post(s.url + "/init_weights_update_group", timeout=10, json={
            "master_address": "127.0.0.1", "master_port": 29999, "rank_offset": 1, "world_size": 2,
            "group_name": "another"})
        assert r.status_code == 409 and "already has a trainer" in r.json()["message"], r.text
        assert "weight_update_group" in r.json()["message"]  # names the group it has
    finally:
        first.close()


def test_a_trainer_that_died_leaves_no_claim(fresh_served):
    """A trainer SIGKILLed after joining: its store no longer listens, so the next trainer
    takes the server over (not "already has a trainer" for ever)."""
    s = fresh_served()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", FIRST_TRAINER, s.url], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "joined"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    second = BroadcastSync([RemoteEngine(s.url)], bucket_mb=1, timeout_s=60)
    second.close()
