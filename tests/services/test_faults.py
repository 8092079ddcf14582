"""Faults on the services path, each provoked for real (docs/RELIABILITY.md lists them):

* the API restarted (SIGKILL, then a new process on the same port and database): the
  trainer's pull rides it out (retries with backoff) and no acknowledged group is lost;
* the inference server restarted (a fresh server on the same port, start-up weights): an
  environment retries its generation until the server answers; the trainer notices the
  server's version is not its own and pushes the weights again;
* an environment process killed mid-run (SIGKILL): the trainer waits, saying what it waits
  for (no environment alive), and goes on once a new environment registers and pushes;
* a malformed ScoredData: tests/services/test_api.py (4xx with the reason, nothing else
  dropped).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch

from baton.controller import ResourcePool, Worker, colocated_groups
from baton.envs import make_environment
from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.rollout.remote import RemoteEngine
from baton.rollout.server import ServerThread, build_app
from baton.services.api import build_api_app
from baton.services.client import APIClient
from baton.services.env_runner import EnvRunner
from baton.sources.api import ApiSource
from baton.workers.policy import Policy
from baton.workers.server_sync import ServerSyncWorker

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "checkpoints/arith-sft")
torch.set_num_threads(1)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline, f"{url} did not come up"
            time.sleep(0.05)


def source_cfg(api_url: str, group_size: int = 4, prompts: int = 2, run_dir: str = "unused"):
    return SimpleNamespace(
        data=SimpleNamespace(api_url=api_url, prompts_per_step=prompts, sync_every=1, api_wait_s=0,
                             servers=[], weights_dir=""),
        rollout=SimpleNamespace(n=group_size), trainer=SimpleNamespace(run_dir=run_dir, save_every=0, steps=10, max_staleness=None),
        model=SimpleNamespace(path=MODEL))


def group(seed: int, n: int = 4) -> dict:
    toks = [[20, 21, 30 + seed, 2] for _ in range(n)]
    return {"tokens": toks, "masks": [[-100, -100, 30 + seed, 2] for _ in range(n)], "scores": [1.0] * n,
            "inference_logprobs": [[1.0, 1.0, -0.5, -0.1]] * n, "policy_version": 0}


def start_api(port: int, db: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-m", "baton.services.api", "--port", str(port), "--db", str(db)],
                         env=ENV, stdout=subprocess.DEVNULL, start_new_session=True)
    wait_http(f"http://127.0.0.1:{port}/health")
    return p


def test_api_restart_loses_nothing_and_the_trainer_reconnects(tmp_path, caplog):
    port, db = free_port(), tmp_path / "api.sqlite"
    url = f"http://127.0.0.1:{port}"
    p = start_api(port, db)
    src = None
    try:
        state = SimpleNamespace(step=0)
        src = ApiSource(source_cfg(url), actor=None, state=state, probe_prompt="")
        assert src.client.batch()["batch"] is None  # the trainer has started: envs may register
        for seed in range(3):
            assert httpx.post(f"{url}/scored_data", json=group(seed), timeout=60).status_code == 200
        assert src.rows(1)[F_RESPONSE][:, 0].tolist() == [30] * 4 + [31] * 4
        os.killpg(p.pid, signal.SIGKILL)  # group 2 is queued, acknowledged, not yet served
        p.wait(10)
        got = {}
        puller = threading.Thread(target=lambda: got.update(rows=src.rows(2)), daemon=True)
        with caplog.at_level(logging.WARNING, logger="baton.services.client"):
            puller.start()  # pulls while the API is down: retried with backoff
            time.sleep(1.0)
            assert puller.is_alive()
            p = start_api(port, db)
            assert httpx.post(f"{url}/scored_data", json=group(3), timeout=60).status_code == 200
            puller.join(60)
        assert not puller.is_alive()
        assert got["rows"][F_RESPONSE][:, 0].tolist() == [32] * 4 + [33] * 4  # nothing lost, oldest first
        assert any("retrying with backoff" in r.message for r in caplog.records)
    finally:
        if src is not None:
            src.close()
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)


F_RESPONSE = "response_ids"


class StubActor(Worker):
    """The actor as the server-sync role sees it: a Policy handle (module + tokenizer)."""

    def __init__(self, path: str, nudge: float = 0.0):
        super().__init__()
        self.policy = Policy(load_model(path), load_tokenizer(path))
        with torch.no_grad():  # trained weights: no longer the checkpoint a server starts from
            for p in self.policy.module.parameters():
                p.add_(nudge)


def serve(port: int, tok) -> tuple[ServerThread, EmbeddedEngine]:
    engine = EmbeddedEngine(load_model(MODEL).eval(), tok)
    return ServerThread(build_app(engine, tok, "arith-sft", model_path=MODEL), port=port), engine


def test_server_restart_env_retries_and_trainer_pushes_weights_again(tmp_path, caplog):
    tok = load_tokenizer(MODEL)
    port = free_port()
    server, engine = serve(port, tok)
    url = server.url
    api = ServerThread(build_api_app(str(tmp_path / "api.sqlite")))
    pool = ResourcePool(1, backend="local")
    groups = colocated_groups(pool, {"actor": (StubActor, (MODEL, 0.01)),
                                     "server_sync": (ServerSyncWorker, ([url],), dict(kind="broadcast",
                                                                                      probe_prompt="1+2="))})
    sync = groups["server_sync"]
    stop = threading.Event()
    try:
        assert max(sync.push(1, check=True)[0]) < 1e-4 and engine.version == 1
        # an environment sampling from the server through the restart
        env = make_environment("arithmetic", tok, group_size=2, max_new_tokens=4)
        env.setup()
        client = APIClient(api.url, stop=stop)
        httpx.post(f"{api.url}/register", json={"batch_size": 2, "max_token_len": 64}, timeout=60)
        httpx.get(f"{api.url}/batch", timeout=60)
        runner = EnvRunner(env, client, [RemoteEngine(url)], concurrency=1, stop=stop)
        runner.register()
        server.stop()  # the server dies ...
        got = {}
        gen = threading.Thread(target=lambda: got.update(group=runner.generate(env.next_item())), daemon=True)
        with caplog.at_level(logging.WARNING):
            gen.start()
            time.sleep(1.5)
            assert gen.is_alive()  # ... the environment keeps retrying ...
            server, engine = serve(port, tok)  # ... and a fresh one (start-up weights, version 0) comes back
            gen.join(60)
            assert got["group"].policy_version == 0 and runner.counts["generate_retries"] >= 1
            assert sync.ensure(1)[0] == 1  # the trainer sees version 0 != 1: it pushes again
            assert sync.verify()[0][0]["sync/verified"] == 1.0  # the fresh server holds the re-push, by content
        assert engine.version == 1 and max(sync.push(2, check=True)[0]) < 1e-4
        assert any("pushing the weights again" in r.message for r in caplog.records)
        assert any("retrying with backoff" in r.message for r in caplog.records)
    finally:
        stop.set()
        sync.close_sync()
        for g in groups.values():
            g.shutdown()
        server.stop()
        api.stop()


def test_a_second_trainer_is_refused_within_seconds_naming_the_server(tmp_path):
    """Two trainers' server-sync roles against one server: the second one's first push
    fails at once (not retried for recover_s, not the rendezvous timeout), one line naming
    the server and that it already has a trainer; the first goes on pushing."""
    tok = load_tokenizer(MODEL)
    server, engine = serve(free_port(), tok)
    pools, roles = [], []
    try:
        for nudge in (0.01, 0.02):
            pools.append(ResourcePool(1, backend="local"))
            roles.append(colocated_groups(pools[-1], {
                "actor": (StubActor, (MODEL, nudge)),
                "server_sync": (ServerSyncWorker, ([server.url],), dict(kind="broadcast", recover_s=120.0))}))
        first, second = roles[0]["server_sync"], roles[1]["server_sync"]
        first.push(1)
        start = time.monotonic()
        with pytest.raises(Exception, match="already has a trainer") as err:
            second.push(1)
        assert time.monotonic() - start < 30  # before: the 120 s rendezvous timeout, then retries
        last = str(err.value).strip().splitlines()[-1]  # the worker's error ends with the remote one's line
        assert last.startswith("baton.sync.broadcast.AlreadyHasTrainer: weight sync: " + server.url), last
        assert "already has a trainer" in last, last
        first.push(2)
        assert engine.version == 2
    finally:
        for r in roles:
            r["server_sync"].close_sync()
            for g in r.values():
                g.shutdown()
        server.stop()


@pytest.mark.slow
def test_env_killed_the_trainer_waits_says_why_and_resumes(tmp_path, caplog, monkeypatch):
    import baton.sources.api as api_source

    monkeypatch.setattr(api_source, "WAIT_REPORT_S", 1.0)
    tok = load_tokenizer(MODEL)
    server, _ = serve(free_port(), tok)
    # a queue of one batch: a dead environment leaves at most one batch behind
    api = ServerThread(build_api_app(str(tmp_path / "api.sqlite"), env_timeout_s=3.0, max_queue=2))
    argv = [sys.executable, "-m", "baton.services.env_runner", "arithmetic", "--api", api.url, "--server",
            server.url, "--tokenizer", MODEL, "--group-size", "4", "--max-new-tokens", "4", "--concurrency", "2"]
    src = ApiSource(source_cfg(api.url, prompts=2), actor=None, state=SimpleNamespace(step=0), probe_prompt="")
    envs = []
    try:
        src.client.batch()  # the trainer has started
        envs.append(subprocess.Popen(argv, env=ENV, start_new_session=True, stderr=subprocess.DEVNULL))
        assert len(src.rows(1)) == 8  # the first environment feeds step 1
        os.killpg(envs[0].pid, signal.SIGKILL)
        envs[0].wait(10)
        got = {}
        puller = threading.Thread(target=lambda: got.update(rows=[src.rows(2), src.rows(3)]), daemon=True)
        with caplog.at_level(logging.WARNING, logger="baton.sources.api"):
            puller.start()
            deadline = time.monotonic() + 30
            while not any("0 of 1 environments alive" in r.message for r in caplog.records):
                assert time.monotonic() < deadline, [r.message for r in caplog.records]
                time.sleep(0.2)
            assert puller.is_alive()  # it waits, and says what for
            envs.append(subprocess.Popen(argv, env=ENV, start_new_session=True, stderr=subprocess.DEVNULL))
            puller.join(120)
        assert [len(r) for r in got["rows"]] == [8, 8]
        assert any("start one: baton env" in r.message for r in caplog.records)
    finally:
        src.close()
        for p in envs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        server.stop()
        api.stop()


def test_server_sync_checks_each_server_by_content_in_its_dtype_and_names_one_changed_since(tmp_path):
    """`ServerSyncWorker.verify` (the API path's `sync/verified`): an fp32 and a bf16 server
    (the trainer's fp32 tensors cast on install) both hold what was pushed: 1.0; weights put
    on one through its own admin endpoint under the same version: 0.0 naming it and the tensor."""
    from baton.sync.checkpoint import save_safetensors_atomic

    tok = load_tokenizer(MODEL)
    plain, half = (ServerThread(build_app(EmbeddedEngine(load_model(MODEL).to(dtype).eval(), tok), tok, "arith-sft",
                                          model_path=MODEL, weights_dirs=[str(tmp_path)]))
                   for dtype in (torch.float32, torch.bfloat16))
    groups = colocated_groups(ResourcePool(1, backend="local"), {
        "actor": (StubActor, (MODEL, 0.01)),
        "server_sync": (ServerSyncWorker, ([plain.url, half.url],), dict(kind="broadcast"))})
    sync = groups["server_sync"]
    try:
        sync.push(1)
        moved, problem = sync.verify()[0]
        assert moved["sync/verified"] == 1.0 and problem is None and moved["sync/bytes"] > 0, problem
        name = "model.norm.weight"
        path = save_safetensors_atomic([(name, torch.zeros_like(load_model(MODEL).model.norm.weight))],
                                       tmp_path / "other.safetensors")
        answer = httpx.post(f"{plain.url}/update_weights_from_disk", json={"model_path": str(path), "version": 1},
                            timeout=60).json()
        assert answer["success"], answer
        moved, problem = sync.verify()[0]
        assert moved["sync/verified"] == 0.0 and problem.startswith(f"server {plain.url} (version 1) ") and \
            f"tensor {name!r}" in problem and "\n" not in problem, problem
    finally:
        sync.close_sync()
        for g in groups.values():
            g.shutdown()
        plain.stop()
        half.stop()
