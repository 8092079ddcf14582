"""The trajectory API's state (`TrajectoryAPI`), shared by the endpoints of `baton api`
(baton/services/api.py): the SQLite store and the settings, and a push admitted group by
group: each checked (shapes, the registration, the environment's group size, its policy
version against the trainer's and `max_staleness`), encoded as it comes, deduplicated by
its Idempotency-Key (`canonical_digest`: a group's meaning, not its bytes) and queued
within the queue's bound (429 beyond it). Its methods run in worker threads, never on the
event loop.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from typing import Any, Iterable

from fastapi import HTTPException

from baton.services._api_http import _parse
from baton.services._api_schemas import (SCORED_KEYS, ScoredData, check_against, check_encodable, check_env_group,
                                         check_group, encode_json, group_version)
from baton.services.store import CONFLICT, DUPLICATE, NEW, GroupStore

_KEY_REUSED = ("Idempotency-Key {key!r} was used before for another request body: use a new key for each push (the same "
               "key only for a retry of the same body)")


def canonical_digest(item: Any) -> str:
    """sha256 of a decoded JSON value's canonical form (sorted keys, no whitespace): what an
    Idempotency-Key's group is compared by, its meaning rather than its bytes."""
    text = json.dumps(item, sort_keys=True, separators=(",", ":"))  # ASCII: lone surrogates escaped
    return hashlib.sha256(text.encode()).hexdigest()


class TrajectoryAPI:
    """State shared by the endpoints: the store and the settings."""

    def __init__(self, store: GroupStore, max_queue: int, retry_after_s: float, env_timeout_s: float):
        self.store, self.max_queue = store, max_queue
        self.retry_after_s, self.env_timeout_s = retry_after_s, env_timeout_s

    @property
    def registration(self) -> dict[str, Any] | None:
        return self.store.get("registration")

    def trainer_version(self) -> int | None:
        return self.store.get("trainer_version")

    def env_status(self) -> list[dict[str, Any]]:
        now = time.time()
        return [{"env_id": e["env_id"], "name": e["real_name"], "connected": bool(e["connected"]),
                 "group_size": e["group_size"], "last_seen_s": round(now - e["last_seen"], 1),
                 "alive": bool(e["connected"]) and now - e["last_seen"] < self.env_timeout_s}
                for e in self.store.envs()]

    def admit(self, g: ScoredData, ctx: tuple) -> tuple | dict[str, Any]:
        """The row to queue for a pushed group, or its rejection {"status", "reason"}.
        `ctx`: (registration, trainer version, {env_id: env}) read once per request."""
        reg, trainer_version, envs = ctx
        max_staleness = reg.get("max_staleness")
        why = check_group(g) or check_against(g, reg) or check_env_group(g, envs.get(g.env_id))
        version = group_version(g)
        if why is None and version is not None and trainer_version is not None and version > trainer_version + 1:
            why = (f"policy_version {version} is ahead of the trainer's version {trainer_version} (at most "
                   f"{trainer_version + 1}: its next weights): no trainer sampled with it")
        if (why is None and version is not None and trainer_version is not None and max_staleness is not None
                and max_staleness >= 0 and version < trainer_version - max_staleness):
            return {"status": 409, "reason": f"stale: policy_version {version} is more than max_staleness="
                                             f"{max_staleness} behind the trainer's version {trainer_version}"}
        if why is not None:
            return {"status": 422, "reason": why}
        body = {k: getattr(g, k) for k in SCORED_KEYS}
        body["finish_reasons"] = g.finish_reasons
        body["policy_version_source"] = "pusher" if version is not None else "stamped"
        try:
            text = encode_json(body).decode("utf-8")
        except (ValueError, UnicodeEncodeError):
            return {"status": 422, "reason": check_encodable(body)}
        return text, g.env_id, len(g.tokens), (trainer_version or 0) if version is None else version

    def push(self, items: Iterable[tuple[int, Any]], key: str | None,
             many: bool) -> tuple[int, int, int, list[dict[str, Any]]]:
        """(groups sent, queued, duplicates, rejections) of a push of decoded ScoredData
        `items` (index, JSON value); runs in a worker thread. Each group is checked and
        encoded as it comes and only its encoded row kept (a 60 MB list is never all Python
        objects at once: no long garbage-collector pauses holding the GIL). `key`: the
        request's Idempotency-Key (group i is `key#i`, recorded with the hash of its meaning,
        `canonical_digest`: a retry re-serialized with other whitespace or key order is the
        same push): a group pushed before under its key with that hash is a duplicate, not checked or queued again (a retry of
        a push that was queued gets 200 even if the group would be refused now, e.g. stale)."""
        seen = {} if key is None else self.store.seen_keys(f"{key}#")
        ctx = (self.registration or {}, self.trainer_version(), {e["env_id"]: e for e in self.store.envs()})
        rows, keys, rejected, sent, dup = [], [], [], 0, 0
        for i, item in items:
            sent += 1
            digest = None if key is None else canonical_digest(item)
            k = None if key is None else (f"{key}#{i}", digest)
            if k is not None and k[0] in seen:
                if seen[k[0]] != digest:
                    rejected.append({"index": i, "status": 422, "reason": _KEY_REUSED.format(key=key)})
                dup += seen[k[0]] == digest
                continue
            try:
                out = self.admit(_parse(ScoredData, item, f"group {i}" if many else "ScoredData"), ctx)
            except HTTPException as exc:
                if not many:
                    raise
                out = {"status": 422, "reason": exc.detail}
            if isinstance(out, dict):
                rejected.append({"index": i, **out})
            else:
                rows.append((i, out))
                keys.append(k)
        if not rows:
            return sent, 0, dup, rejected
        done = self.store.push_many([row for _, row in rows], max_queued=self.max_queue, keys=keys)
        if done is None:
            counts = self.store.counts()
            raise HTTPException(429, f"queue full: {counts['queued_groups']} groups queued, the bound is "
                                     f"{self.max_queue} (--max-queue); retry later",
                                headers={"Retry-After": f"{max(1, math.ceil(self.retry_after_s))}"})
        queued = 0
        for (i, _row), (what, _) in zip(rows, done):  # a concurrent push with the same key may have come first
            queued += what == NEW
            dup += what == DUPLICATE
            if what == CONFLICT:
                rejected.append({"index": i, "status": 422, "reason": _KEY_REUSED.format(key=key)})
        for env_id in {row[1] for _, row in rows if row[1] is not None}:
            self.store.touch_env(env_id)
        return sent, queued, dup, sorted(rejected, key=lambda r: r["index"])
