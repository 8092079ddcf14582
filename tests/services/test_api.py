"""`baton api` against the Atropos wire protocol (shared/reference/atropos-protocol.md), and
where it does better: oldest-first batches, staleness by admission, a bounded queue (429 +
Retry-After), persistence across a SIGKILL, bearer token, 4xx with reasons.

`AtroposEnv` / `atropos_trainer_*` below are written from the protocol reference (what
atroposlib 0.4.0's BaseEnv and example trainer send and read), byte for byte where it
matters: a JSON body on GET /status-env, gzip bodies >= 1 KB, retry on a non-"success"
register-env, `overrides` read without a fallback."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from baton.rollout.server import ServerThread
from baton.services.api import build_api_app

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def api(tmp_path):
    servers = []

    def start(**kw):
        kw.setdefault("db_path", str(tmp_path / "api.sqlite"))
        s = ServerThread(build_api_app(kw.pop("db_path"), **kw))
        servers.append(s)
        return s.url

    yield start
    for s in servers:
        s.stop()


def group(n=2, prompt=(5, 6, 7), resp_len=3, score=1.0, env_id=None, version=None, seed=0):
    toks, masks = [], []
    for i in range(n):
        resp = [10 + seed + i + j for j in range(resp_len)]
        toks.append(list(prompt) + resp)
        masks.append([-100] * len(prompt) + resp)
    g = {"tokens": toks, "masks": masks, "scores": [score - i for i in range(n)], "env_id": env_id}
    if version is not None:
        g["policy_version"] = version
    return g


class AtroposEnv:
    """What atroposlib's BaseEnv does over HTTP (from the protocol reference)."""

    def __init__(self, url):
        self.http = httpx.Client(base_url=url, timeout=10)
        self.env_id = None

    def register(self, group_size=2, tries=20):
        for _ in range(tries):
            r = self.http.post("/register-env", json={"max_token_length": 64, "desired_name": "atropos_env",
                                                      "weight": 1.0, "group_size": group_size})
            assert r.headers["content-type"].startswith("application/json")
            data = r.json()
            if data.get("status") == "success":
                for key in ("env_id", "wandb_name", "starting_step", "checkpoint_dir", "checkpoint_interval",
                            "num_steps"):
                    assert key in data, key
                self.env_id = data["env_id"]
                return data
            time.sleep(0.05)
        raise AssertionError("register-env never succeeded")

    def status(self):
        # httpx refuses a body on .get(); atroposlib uses aiohttp, which sends one: same bytes
        r = self.http.request("GET", "/status-env", content=json.dumps({"env_id": self.env_id}),
                              headers={"Content-Type": "application/json"})
        r.raise_for_status()
        s = r.json()
        for key in ("current_step", "queue_size", "self_queue_size", "env_weight", "unallocated_fraction",
                    "max_group_size"):
            assert key in s, key
        assert s["env_weight"] > 0
        return s

    def post(self, path, body):
        raw = json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if len(raw) >= 1024:
            raw, headers["Content-Encoding"] = gzip.compress(raw), "gzip"
        return self.http.post(path, content=raw, headers=headers)


def atropos_trainer_register(url, batch_size=4):
    r = httpx.post(f"{url}/register", json={
        "wandb_group": "g", "wandb_project": "p", "batch_size": batch_size, "max_token_len": 256,
        "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 100}, timeout=60)
    assert r.status_code == 200 and "uuid" in r.json()


def atropos_trainer_batch(url, **params):
    r = httpx.get(f"{url}/batch", params=params, timeout=60)
    assert r.status_code == 200, r.text
    batch = r.json()["batch"]
    if batch is not None:
        for g in batch:
            _ = g["overrides"]  # read without a fallback by the example trainer
            assert set(g) >= {"tokens", "masks", "scores", "advantages", "ref_logprobs", "messages",
                              "generation_params", "inference_logprobs", "overrides", "group_overrides",
                              "images", "env_id"}
    return batch


def test_atropos_handshake_and_batches(api):
    url = api()
    assert httpx.get(f"{url}/info", timeout=60).json() == {"batch_size": -1, "max_token_len": -1}
    env = AtroposEnv(url)
    r = env.http.post("/register-env", json={"max_token_length": 64, "desired_name": "e", "weight": 1.0,
                                             "group_size": 2})
    assert r.json() == {"status": "wait for trainer to start"}
    atropos_trainer_register(url, batch_size=4)
    assert httpx.get(f"{url}/info", timeout=60).json() == {"batch_size": 4, "max_token_len": 256}  # the big group below fits (longer: 422)
    assert httpx.get(f"{url}/wandb_info", timeout=60).json()["group"] == "g"
    r = env.http.post("/register-env", json={"max_token_length": 64, "desired_name": "e", "weight": 1.0,
                                             "group_size": 2})
    assert r.json() == {"status": "wait for trainer to start"}  # until the first GET /batch
    assert atropos_trainer_batch(url) is None  # null, not []
    env.register()
    assert env.status()["queue_size"] == 0
    # a big group (gzip), unknown keys and empty optionals are fine
    big = group(2, prompt=tuple(range(4, 200)), env_id=env.env_id, seed=0)
    big.update(unknown_key={"x": 1}, overrides=[], group_overrides={}, messages=None)
    assert env.post("/scored_data", big).status_code == 200
    assert env.post("/scored_data_list", [group(2, env_id=env.env_id, seed=1),
                                          group(2, env_id=env.env_id, seed=2)]).json()["groups_processed"] == 2
    s = env.status()
    assert s["queue_size"] == 3 and s["self_queue_size"] == 3  # groups, not sequences
    step0 = httpx.get(f"{url}/status", timeout=60).json()["current_step"]
    b1 = atropos_trainer_batch(url)
    b2 = atropos_trainer_batch(url)
    assert sum(len(g["tokens"]) for g in b1) == 4
    assert [g["tokens"][0][-3] for g in b1] == [10, 10 + 1]  # oldest first: the big group, then seed 1
    assert b2 is None  # one group (2 sequences) left: not a full batch
    assert httpx.get(f"{url}/status", timeout=60).json()["current_step"] == step0 + 1
    assert httpx.get(f"{url}/latest_example", timeout=60).json()["tokens"][0][-3] == 12
    assert env.http.post("/disconnect-env", json={"env_id": env.env_id}).json() == {"status": "success"}
    assert httpx.post(f"{url}/reset_data", params={"force": "true"}, timeout=60).text == "Reset successful"
    assert httpx.get(f"{url}/info", timeout=60).json()["batch_size"] == -1


def test_malformed_groups_get_reasons_and_nothing_else_is_dropped(api):
    url = api()
    atropos_trainer_register(url, batch_size=4)
    atropos_trainer_batch(url)
    env = AtroposEnv(url)
    env.register()
    assert env.post("/scored_data", group(2, env_id=0, seed=0)).status_code == 200
    bad_mask = group(2, env_id=0)
    bad_mask["masks"][1][4] = 1  # neither -100 nor the token
    r = env.post("/scored_data", bad_mask)
    assert r.status_code == 422 and "sequence 1, position 4" in r.json()["detail"]
    short = group(2, env_id=0)
    short["scores"] = [1.0]
    r = env.post("/scored_data", short)
    assert r.status_code == 422 and "one entry per sequence" in r.json()["detail"]
    r = env.post("/scored_data", {"tokens": "nope"})
    assert r.status_code == 422 and "tokens" in r.json()["detail"]
    r = env.http.post("/scored_data", content=b"{not json", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "JSON" in r.json()["detail"]
    r = env.http.post("/scored_data", content=b"garbage", headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.json()["detail"]
    r = env.http.post("/scored_data", content=b'{"tokens": [[1]], "masks": [[1]], "scores": [NaN]}')
    assert r.status_code == 422 and "finite" in r.json()["detail"]
    # a list with one bad group: the good ones are queued, the 422 says which was not
    r = env.post("/scored_data_list", [group(2, env_id=0, seed=1), bad_mask, group(2, env_id=0, seed=2)])
    assert r.status_code == 422
    detail = r.json()["detail"]
    assert detail["queued"] == 2 and [x["index"] for x in detail["rejected"]] == [1]
    status = httpx.get(f"{url}/status", timeout=60).json()
    assert status["queued_groups"] == 3
    b = atropos_trainer_batch(url)
    assert [g["tokens"][0][-3] for g in b] == [10, 11]


def test_bounded_queue_429_retry_after(api):
    url = api(max_queue=2, retry_after_s=2)
    atropos_trainer_register(url, batch_size=2)
    for seed in range(2):
        assert httpx.post(f"{url}/scored_data", json=group(2, seed=seed), timeout=60).status_code == 200
    r = httpx.post(f"{url}/scored_data", json=group(2, seed=9), timeout=60)
    assert r.status_code == 429 and r.headers["retry-after"] == "2" and "queue full" in r.json()["detail"]
    r = httpx.post(f"{url}/scored_data_list", json=[group(2, seed=9)], timeout=60)
    assert r.status_code == 429
    assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 2
    atropos_trainer_batch(url)  # frees one slot
    assert httpx.post(f"{url}/scored_data", json=group(2, seed=9), timeout=60).status_code == 200


def test_staleness_bound_is_admission_not_silent_drop(api):
    url = api()
    r = httpx.post(f"{url}/register", json={"batch_size": 2, "max_token_len": 64, "max_staleness": 1}, timeout=60)
    assert r.status_code == 200
    for v in (0, 1, 2):
        assert httpx.post(f"{url}/scored_data", json=group(2, version=v, seed=v), timeout=60).status_code == 200
    # the trainer is at version 3 and accepts groups at most 1 version old: 0 and 1 are stale
    r = httpx.get(f"{url}/batch", params={"version": 3}, timeout=60).json()
    assert r["stale_groups"] == 2 and [g["policy_version"] for g in r["batch"]] == [2]
    status = httpx.get(f"{url}/status", timeout=60).json()
    assert status["stale_groups"] == 2 and status["trainer_version"] == 3  # kept and counted
    # a push already too old is refused, with the reason
    r = httpx.post(f"{url}/scored_data", json=group(2, version=1), timeout=60)
    assert r.status_code == 409 and "stale" in r.json()["detail"]
    # no version given (a stock Atropos env): stamped with the trainer's version
    assert httpx.post(f"{url}/scored_data", json=group(2), timeout=60).status_code == 200
    b = httpx.get(f"{url}/batch", params={"version": 3}, timeout=60).json()["batch"]
    assert b[0]["policy_version"] == 3 and b[0]["policy_version_source"] == "stamped"


def test_bearer_token(api):
    url = api(token="s3cret")
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200
    r = httpx.get(f"{url}/info", timeout=60)
    assert r.status_code == 401 and "missing" in r.json()["detail"]  # the API's shape (client.py reads it)
    assert r.headers["www-authenticate"] == 'Bearer realm="baton api"'
    assert httpx.get(f"{url}/info", headers={"Authorization": "Bearer s3cret"}, timeout=60).status_code == 200
    r = httpx.get(f"{url}/info", headers={"Authorization": "Bearer nope"}, timeout=60)
    assert r.status_code == 401 and r.json() == {"detail": "invalid API key"}


def _start_api_process(db: Path) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-m", "baton.services.api", "--port", "0", "--db", str(db)],
                         stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
    line = p.stdout.readline()
    assert line.startswith("baton api: http://"), line
    url = line.split()[2]
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return p, url
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_groups_survive_kill_9_of_the_api(tmp_path):
    db = tmp_path / "api.sqlite"
    p, url = _start_api_process(db)
    try:
        atropos_trainer_register(url, batch_size=4)
        atropos_trainer_batch(url)
        for seed in range(3):
            assert httpx.post(f"{url}/scored_data", json=group(2, seed=seed, version=0), timeout=60).status_code == 200
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
        p, url = _start_api_process(db)  # same db, new port
        assert httpx.get(f"{url}/info", timeout=60).json()["batch_size"] == 4  # the registration survived too
        b = atropos_trainer_batch(url)
        assert [g["tokens"][0][-3] for g in b] == [10, 11]
        assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 1
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(10)
