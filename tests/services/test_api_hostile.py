"""`baton api` under hostile or mistaken input (issue 22 §1): it never answers 500, never
loses a group it acknowledged, and refuses at push (4xx naming the field) the groups that
would break or stall the trainer. Real uvicorn on 127.0.0.1, real SQLite."""

from __future__ import annotations

import gzip
import json

import httpx

from tests.services.test_api import api, atropos_trainer_batch, atropos_trainer_register, group  # noqa: F401, F811  (fixtures)


def _register(url, **extra):
    body = {"wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64, "checkpoint_dir": "c",
            "save_checkpoint_interval": 0, "starting_step": 0, "num_steps": 10, **extra}
    return httpx.post(f"{url}/register", json=body, timeout=60)


def _push(url, g):
    return httpx.post(f"{url}/scored_data", content=json.dumps(g), headers={"Content-Type": "application/json"}, timeout=60)


def test_non_finite_logprobs_and_surrogates_are_refused_at_push_and_no_group_is_lost(api):
    url = api()
    assert _register(url).status_code == 200
    atropos_trainer_batch(url)
    good = [group(2, seed=s) for s in range(3)]
    for g in good:
        assert _push(url, g).status_code == 200
    bad_nan = group(2, seed=7) | {"inference_logprobs": [[0.0] * 6, [0.0] * 5 + [float("-inf")]]}
    raw = json.dumps(bad_nan)  # -Infinity literal, as Python's json writes it
    r = httpx.post(f"{url}/scored_data", content=raw, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 422 and "inference_logprobs" in r.text and "finite" in r.text, r.text
    surrogate = group(2, seed=8) | {"messages": [[{"role": "user", "content": "\ud800"}]] * 2}
    r = httpx.post(f"{url}/scored_data", content=json.dumps(surrogate), headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code in (400, 422) and "surrogate" in r.text.lower(), r.text
    seen = []
    for _ in range(3):
        r = httpx.get(f"{url}/batch", timeout=60)
        assert r.status_code == 200, r.text
        if r.json()["batch"] is not None:
            seen += [g["tokens"][0][-3] for g in r.json()["batch"]]
    assert seen == [10, 11]  # the two valid batches' groups, oldest first: nothing lost
    assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 1


def test_hostile_values_are_4xx_never_500(api):
    url = api()
    deep = "[" * 100_000 + "]" * 100_000
    assert httpx.post(f"{url}/register", content=deep, headers={"Content-Type": "application/json"}, timeout=60).status_code == 400
    for key, value in (("batch_size", 2**70), ("batch_size", 0), ("max_token_len", 2**70)):
        r = _register(url, **{key: value})
        assert r.status_code == 422 and key in r.text, (key, value, r.text)
    assert _register(url).status_code == 200
    atropos_trainer_batch(url)
    for gs in (0, 2**63, -5):
        r = httpx.post(f"{url}/register-env", json={"max_token_length": 64, "desired_name": "e", "group_size": gs}, timeout=60)
        assert r.status_code == 422 and "group_size" in r.text, (gs, r.text)
    for key, value in (("env_id", 2**70), ("policy_version", 2**70)):
        r = _push(url, group(2) | {key: value})
        assert r.status_code == 422 and key in r.text, (key, r.text)
    g = group(2)
    g["tokens"][0][-1] = g["masks"][0][-1] = 2**40
    r = _push(url, g)
    assert r.status_code == 422 and "token" in r.text, r.text
    assert httpx.get(f"{url}/status", timeout=60).status_code == 200


def test_groups_are_checked_against_the_registration(api):
    url = api()
    assert _register(url, batch_size=8, max_token_len=8, group_size=4, vocab_size=100).status_code == 200
    atropos_trainer_batch(url)
    r = _push(url, group(3))
    assert r.status_code == 422 and "group_size" in r.text and "4" in r.text and "3" in r.text, r.text
    r = _push(url, group(4, resp_len=20))
    assert r.status_code == 422 and "max_token_len" in r.text and "8" in r.text, r.text
    g = group(4)
    g["tokens"][1][-1] = g["masks"][1][-1] = 100
    r = _push(url, g)
    assert r.status_code == 422 and "vocab_size" in r.text and "100" in r.text, r.text
    r = httpx.post(f"{url}/register-env", json={"max_token_length": 8, "desired_name": "e", "group_size": 3}, timeout=60)
    assert r.status_code == 409 and "group_size" in r.text, r.text
    assert _push(url, group(4)).status_code == 200
    s = httpx.get(f"{url}/status", timeout=60).json()  # what the trainer waits for, in the API's own words
    assert (s["batch_size"], s["group_size"], s["max_token_len"]) == (8, 4, 8)


def test_a_group_must_have_its_environments_group_size(api):
    """Issue 32: an environment registered at group_size 8 pushing a group of 3 is refused,
    naming both numbers (was: 200); a group without an env_id is checked against the
    trainer's registration only (Atropos-compatible)."""
    url = api()
    assert _register(url, batch_size=16, max_token_len=64).status_code == 200
    atropos_trainer_batch(url)
    env = httpx.post(f"{url}/register-env", json={"max_token_length": 64, "desired_name": "e", "group_size": 8}, timeout=60)
    env_id = env.json()["env_id"]
    r = _push(url, group(3, env_id=env_id))
    assert r.status_code == 422 and "3 sequences" in r.text and "group_size 8" in r.text, r.text
    r = httpx.post(f"{url}/scored_data_list", json=[group(8, env_id=env_id), group(3, env_id=env_id)], timeout=60)
    assert r.status_code == 422 and r.json()["detail"]["queued"] == 1, r.text
    assert [x["index"] for x in r.json()["detail"]["rejected"]] == [1]
    assert _push(url, group(3)).status_code == 200
    assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 2


def test_a_conflicting_registration_names_both_values(api):
    url = api()
    assert _register(url, batch_size=128).status_code == 200
    assert _register(url, batch_size=128).status_code == 200  # the same trainer reconnecting
    r = _register(url, batch_size=64)
    assert r.status_code == 409 and "128" in r.text and "64" in r.text and "batch_size" in r.text, r.text


def test_reset_data_is_a_post_refused_while_a_trainer_is_registered(api):
    url = api()
    assert _register(url).status_code == 200
    atropos_trainer_batch(url)
    assert _push(url, group(2)).status_code == 200
    assert httpx.get(f"{url}/reset_data", timeout=60).status_code == 405
    r = httpx.post(f"{url}/reset_data", timeout=60)
    assert r.status_code == 409 and "force" in r.text, r.text
    assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 1
    assert httpx.post(f"{url}/reset_data", params={"force": "true"}, timeout=60).status_code == 200
    assert httpx.get(f"{url}/status", timeout=60).json()["queued_groups"] == 0


def test_bodies_are_capped_plain_and_decompressed(api):
    url = api(max_body_bytes=1 << 20)
    assert _register(url).status_code == 200
    bomb = gzip.compress(b"[" + b" " * (64 << 20) + b"]")  # 64 MiB of JSON in ~64 KB
    r = httpx.post(f"{url}/scored_data_list", content=bomb,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"}, timeout=60)
    assert r.status_code == 413 and "decompressed" in r.text, r.text
    r = httpx.post(f"{url}/scored_data_list", content=b"[" + b" " * (2 << 20) + b"]",
                   headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 413, r.text


def test_a_batch_is_served_again_until_the_trainer_acknowledges_it(api):
    url = api()
    assert _register(url).status_code == 200
    atropos_trainer_batch(url)
    for s in range(4):
        assert _push(url, group(2, seed=s)).status_code == 200
    first = httpx.get(f"{url}/batch", params={"ack": 0}, timeout=60).json()  # a trainer that acknowledges
    again = httpx.get(f"{url}/batch", params={"ack": 0}, timeout=60).json()  # its response was lost: the same batch
    assert first["batch_id"] == again["batch_id"] and first["batch"] == again["batch"]
    nxt = httpx.get(f"{url}/batch", params={"ack": first["batch_id"]}, timeout=60).json()
    assert nxt["batch_id"] != first["batch_id"]
    assert [g["tokens"][0][-3] for g in nxt["batch"]] == [12, 13]
    assert httpx.get(f"{url}/status", timeout=60).json()["served_groups"] == 2  # the acknowledged ones
