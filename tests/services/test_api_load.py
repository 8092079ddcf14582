"""`baton api` under load and retries (issue 38 §4-5): /health is answered while SQLite
writes are in progress (they run off the event loop); a push retried with the same
Idempotency-Key is queued once; an ack names a batch that was handed out; a policy_version
cannot be ahead of the trainer's.

A write is held in progress by the test itself: a second SQLite connection takes the
database's write lock (BEGIN IMMEDIATE), so every push the API accepts waits inside its
write until the test commits. Nothing here races a clock: /health must answer while the
writes are still held (they cannot finish before the test lets them)."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from baton.rollout.server import ServerThread
from baton.services._api_http import iter_json_array
from baton.services.api import build_api_app
from baton.services.client import APIClient, APIError
from baton.services.store import CONFLICT, DUPLICATE, NEW, GroupStore
from tests.services.test_api import group


@pytest.fixture
def served(tmp_path):
    """(url, app, db path) of a real `baton api` on loopback with a registered trainer."""
    db = tmp_path / "api.sqlite"
    app = build_api_app(str(db))
    with ServerThread(app) as server:
        r = httpx.post(f"{server.url}/register", json={"batch_size": 4, "max_token_len": 64})
        assert r.status_code == 200
        yield server.url, app, db


class WriteHold:
    """The database's write lock, taken by another connection until `release()`."""

    def __init__(self, db):
        self.conn = sqlite3.connect(str(db), isolation_level=None, timeout=30)
        self.conn.execute("BEGIN IMMEDIATE")

    def release(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


def _wait_until(cond, what: str, limit_s: float = 60.0) -> None:
    """Poll `cond` (a state the test causes; the limit only stops a broken run from hanging)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _push(url, body, key=None, path="/scored_data"):
    headers = {} if key is None else {"Idempotency-Key": key}
    return httpx.post(f"{url}{path}", json=body, headers=headers, timeout=120)


def test_health_answers_while_20_concurrent_pushes_wait_on_a_held_write(served):
    url, app, db = served
    store = app.state.api.store
    hold = WriteHold(db)
    with ThreadPoolExecutor(21) as pool:
        pushes = [pool.submit(_push, url, group(2, seed=s), uuid.uuid4().hex) for s in range(20)]
        pushes.append(pool.submit(_push, url, [group(2, seed=100 + s) for s in range(3)], None, "/scored_data_list"))
        _wait_until(store._lock.locked, "a push inside its write")  # the API is writing (and waiting)
        r = httpx.get(f"{url}/health", timeout=10)  # the hold lasts until the test releases it: no race
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert not any(p.done() for p in pushes)  # answered while every push was still held
        hold.release()
        assert [p.result().status_code for p in pushes] == [200] * 21
    assert httpx.get(f"{url}/status").json()["queued_groups"] == 23


def test_a_retried_push_is_queued_once(served):
    url, app, db = served
    # the same key and body twice (a retry): queued once, the second answer says so
    g = group(2, seed=1)
    assert _push(url, g, "k1").json() == {"status": "received"}
    assert _push(url, g, "k1").json() == {"status": "received", "duplicate": True}
    # the same key for another body: refused, naming the key
    r = _push(url, group(2, seed=2), "k1")
    assert r.status_code == 422 and "'k1' was used before for another request body" in r.json()["detail"]
    # a list retried: every group already queued
    lst = [group(2, seed=s) for s in (3, 4)]
    assert _push(url, lst, "k2", "/scored_data_list").json() == {"status": "received", "groups_processed": 2}
    again = _push(url, lst, "k2", "/scored_data_list").json()
    assert again == {"status": "received", "groups_processed": 2, "duplicates": 2}
    # no key (a stock Atropos environment): every push is queued, as Atropos does
    assert _push(url, g).status_code == 200
    assert httpx.get(f"{url}/status").json()["queued_groups"] == 4


def test_the_clients_retry_after_a_timeout_does_not_queue_twice(served):
    url, app, db = served
    hold = WriteHold(db)  # the first attempt cannot finish: the client times out and retries
    client = APIClient(url, timeout=1.0, retry_for_s=None, max_backoff_s=0.5, name="env")
    done = threading.Event()
    t = threading.Thread(target=lambda: (client.push(group(2, seed=7)), done.set()), daemon=True)
    t.start()
    _wait_until(lambda: client.retries >= 1, "the client's retry after a timeout")
    assert not done.is_set()
    hold.release()
    t.join(timeout=120)
    assert done.is_set()
    client.close()
    assert httpx.get(f"{url}/status").json()["queued_groups"] == 1


def test_an_ack_for_a_batch_never_handed_out_is_refused_and_marks_nothing(served):
    url, app, db = served
    for s in range(4):
        assert _push(url, group(2, seed=s)).status_code == 200
    r = httpx.get(f"{url}/batch", params={"ack": 3})
    assert r.status_code == 409 and "ack=3: no batch with that batch_id was handed out" in r.json()["detail"]
    first = httpx.get(f"{url}/batch", params={"ack": 0}).json()
    r = httpx.get(f"{url}/batch", params={"ack": first["batch_id"] + 1})
    assert r.status_code == 409 and f"the last one was {first['batch_id']}" in r.json()["detail"]
    status = httpx.get(f"{url}/status").json()
    assert status["leased_groups"] == 2 and status["served_groups"] == 0  # still held, not marked served
    assert httpx.get(f"{url}/batch", params={"ack": 0}).json() == first  # served again until acknowledged
    c = APIClient(url)
    with pytest.raises(APIError, match="409"):  # the trainer's client: an error at once, not retried
        c.batch(ack=first["batch_id"] + 5)
    c.close()
    nxt = httpx.get(f"{url}/batch", params={"ack": first["batch_id"]}).json()
    assert nxt["batch_id"] == first["batch_id"] + 1
    assert httpx.get(f"{url}/status").json()["served_groups"] == 2


def test_batches_since_the_checkpoint_are_served_again_in_order_and_acked_ones_never(served):
    """Delivery tied to checkpoints (issue 49): a trainer holding batches 1-3 whose checkpoint
    has batch 1 (ack=1) is, after a crash, served 2 and 3 again (after=1, then 2), the same
    groups with their ids, then new ones; POST /ack acknowledges up to a batch at once, and
    an acknowledged batch is never served again."""
    url, app, db = served
    for s in range(10):
        assert _push(url, group(2, seed=s)).status_code == 200
    held = [httpx.get(f"{url}/batch", params={"ack": 0, "after": b}).json() for b in range(3)]
    assert [h["batch_id"] for h in held] == [1, 2, 3]  # a trainer between checkpoints holds all three
    assert [g["group_id"] for h in held for g in h["batch"]] == [1, 2, 3, 4, 5, 6]
    again = httpx.get(f"{url}/batch", params={"ack": 1, "after": 1}).json()  # resumed from batch 1's checkpoint
    assert again == held[1]
    assert httpx.get(f"{url}/batch", params={"ack": 1, "after": 2}).json() == held[2]
    status = httpx.get(f"{url}/status").json()
    assert status["served_groups"] == 2 and status["leased_groups"] == 4
    assert httpx.post(f"{url}/ack", params={"ack": 3}).json() == {"acknowledged_groups": 4}
    nxt = httpx.get(f"{url}/batch", params={"ack": 3, "after": 3}).json()
    assert nxt["batch_id"] == 4 and [g["group_id"] for g in nxt["batch"]] == [7, 8]
    r = httpx.get(f"{url}/batch", params={"ack": 3, "after": 2})
    assert r.status_code == 409 and "after=2 < ack=3" in r.json()["detail"]
    r = httpx.get(f"{url}/batch", params={"after": 2})
    assert r.status_code == 409 and "after= needs ack=" in r.json()["detail"]
    r = httpx.post(f"{url}/ack", params={"ack": 9})
    assert r.status_code == 409 and "ack=9: no batch with that batch_id was handed out" in r.json()["detail"]
    assert httpx.get(f"{url}/status").json()["served_groups"] == 6  # the refusals marked nothing


def test_a_policy_version_ahead_of_the_trainer_is_refused(served):
    url, app, db = served
    assert httpx.get(f"{url}/batch", params={"version": 3}).status_code == 200  # the trainer is at 3
    r = _push(url, group(2, version=10**6))
    assert r.status_code == 422 and "policy_version 1000000 is ahead of the trainer's version 3" in r.json()["detail"]
    assert _push(url, group(2, version=5)).status_code == 422
    assert _push(url, group(2, version=4, seed=1)).status_code == 200  # its next weights: sampled before it pulls
    assert _push(url, group(2, version=3, seed=2)).status_code == 200
    assert httpx.get(f"{url}/status").json()["queued_groups"] == 2


@pytest.mark.parametrize("text", [' [ 1 , {"a": [2, null]} ,"x" ] ', "[]", "[ ]\n", '[[1, 2], [3]]', '[-1.5e3, "\\u00e9"]'])
def test_a_json_array_decoded_one_element_at_a_time_is_json_loads(text):
    assert list(iter_json_array(text)) == json.loads(text)


@pytest.mark.parametrize("text", ["[1,]", "[1] x", "[1 2]", "[", "[1,", "", "{}"])
def test_a_json_array_json_loads_refuses_is_refused(text):
    if text != "{}":  # valid JSON, but not an array
        with pytest.raises(json.JSONDecodeError):
            json.loads(text)
    with pytest.raises(ValueError):
        list(iter_json_array(text))


def test_pushes_waiting_together_are_one_transaction_checked_in_turn(tmp_path):
    """Group commit: while a write is held, pushes pile up; the next lock holder commits them
    in one transaction, each checked in turn (its key, the queue bound) as if alone."""
    store = GroupStore(tmp_path / "s.sqlite")
    row = ('{"tokens": [[1]]}', None, 1, 0)
    hold = WriteHold(tmp_path / "s.sqlite")
    with ThreadPoolExecutor(5) as pool:
        first = pool.submit(store.push_many, [row], 3, [("a#0", "d1")])
        _wait_until(store._lock.locked, "the first push inside its write")
        rest = [pool.submit(store.push_many, [row], 3, k) for k in
                ([("a#0", "d1")], [("a#0", "d2")], [("b#0", "d1")], None)]
        _wait_until(lambda: len(store._pending) == 4, "four pushes waiting for the lock")
        hold.release()
        out = [first.result()] + [f.result() for f in rest]
    assert [o[0][0] if o else o for o in out] == [NEW, DUPLICATE, CONFLICT, NEW, NEW]
    assert out[1][0][1] == out[0][0][1]  # the duplicate names the group first queued
    assert store.push_many([row], 3) is None  # three queued: the bound
    assert store.counts()["queued_groups"] == 3


def test_a_retry_re_serialized_is_the_same_push(served):
    """Issue 50.9: the same group with other whitespace and key order on retry is a
    duplicate (before: 422 "another request body": the raw bytes were hashed)."""
    url, app, db = served
    g = group(2, seed=11)
    assert _push(url, g, "k9").json() == {"status": "received"}
    again = json.dumps(dict(reversed(list(g.items()))), indent=2).encode()  # other key order, whitespace
    r = httpx.post(f"{url}/scored_data", content=again, timeout=60,
                   headers={"Idempotency-Key": "k9", "Content-Type": "application/json"})
    assert r.json() == {"status": "received", "duplicate": True}, r.text
    r = _push(url, group(2, seed=12), "k9")  # another meaning: still refused
    assert r.status_code == 422 and "'k9' was used before" in r.json()["detail"]
    assert httpx.get(f"{url}/status").json()["queued_groups"] == 1


@pytest.mark.parametrize("chars", [256, 20_000, 200_000])
def test_a_long_idempotency_key_is_a_400_naming_the_limit(tmp_path, chars):
    """Issue 50.9: a 200,000-character key was a bare 400 (or a closed connection) from the
    HTTP layer; a 20,000-character one was accepted and stored. `baton api`'s server options
    (UVICORN_OPTIONS) let such a header reach the app, which names the limit."""
    from baton.services.api import MAX_KEY_CHARS, UVICORN_OPTIONS

    with ServerThread(build_api_app(str(tmp_path / "api.sqlite")), **UVICORN_OPTIONS) as server:
        r = _push(server.url, group(2, seed=1), "k" * chars)
        assert r.status_code == 400, r.text
        assert f"Idempotency-Key is {chars:,} characters; the limit is {MAX_KEY_CHARS}" in r.json()["detail"]
        assert _push(server.url, group(2, seed=1), "k" * MAX_KEY_CHARS).status_code == 200
