"""`baton serve` as a real process (the CLI entry point), synced by distributed broadcast."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

from baton.rollout.remote import RemoteEngine
from baton.sync import BroadcastSync, check_logprob_parity

PROMPT = [5, 9, 11, 4, 7]


@pytest.fixture
def server_process(tmp_path, tiny_qwen, sync_tokenizer):
    ckpt = tmp_path / "ckpt"
    tiny_qwen(0).save_pretrained(ckpt)
    sync_tokenizer.save_pretrained(ckpt)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; from baton.rollout.server import serve_main; serve_main(sys.argv[1:])",
         str(ckpt), "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        seen = []
        for line in proc.stdout:  # "baton serve: ckpt on http://127.0.0.1:PORT (cpu, float32)"
            seen.append(line)
            m = re.search(r"http://127\.0\.0\.1:\d+", line)
            if m:
                break
        assert m, f"baton serve did not report its address: {''.join(seen)[-2000:]}"
        # keep reading so a chatty server never blocks on a full pipe
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        yield m.group(0)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_broadcast_into_server_process(server_process, tiny_qwen):
    remote = RemoteEngine(server_process)
    remote.wait_ready(timeout=60)
    trainer = tiny_qwen(1)
    assert check_logprob_parity(remote, trainer, PROMPT) > 1e-2
    sync = BroadcastSync([remote], bucket_mb=0.05)
    t0 = time.monotonic()
    sync.push(trainer.named_parameters(), version=1)
    assert time.monotonic() - t0 < 30
    assert check_logprob_parity(remote, trainer, PROMPT) < 1e-4
    assert remote.generate([PROMPT], remote_params())[0].version == 1
    sync.close()


def remote_params():
    from baton.protocol import SamplingParams
    return SamplingParams(temperature=0, max_new_tokens=3)
