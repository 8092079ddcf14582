"""The trajectory API's durable state: scored groups, registered environments, the trainer's
registration, in one SQLite file in WAL mode.

    store = GroupStore("runs/x/api.sqlite")
    ids = store.push_many([(group_json, 0, 8, 3)], max_queued=1024, keys=[("key#0", digest)])
    batch = store.take_batch(batch_size=64, step=1, version=5, max_staleness=2)

Every write is one transaction with `synchronous=FULL`, so a group the API answered 200 for
is on disk: a process killed with SIGKILL (or a power cut, as far as the disk honours
fsync) and restarted on the same file serves it. Groups move `queued` -> `served` (handed
to the trainer in a batch, once; or `queued` -> `leased` -> `served` when the trainer
acknowledges batches, which baton's trainer does once a checkpoint holds their update:
at-least-once, exactly once per checkpoint) or `queued` -> `stale` (older than the trainer's staleness
bound when it pulled: kept and counted, never silently deleted). Served groups beyond the
newest `keep_served` are pruned.

Pushes may carry a client-side key (the `Idempotency-Key` header): a key seen before with the
same body digest is not queued again (a retried push), with another digest it is refused.
The newest `KEEP_KEYS` keys are remembered (the rest pruned).

Thread-safe: one connection guarded by a lock. Called from worker threads (the API keeps
its event loop free); concurrent `push_many` calls are committed together (group commit:
whoever takes the lock commits every push waiting for it in one transaction, one fsync).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable

SCHEMA = """
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS envs (
    env_id INTEGER PRIMARY KEY, desired_name TEXT NOT NULL, real_name TEXT NOT NULL,
    max_token_length INTEGER NOT NULL, weight REAL NOT NULL, group_size INTEGER NOT NULL,
    min_batch_allocation REAL, connected INTEGER NOT NULL, registered REAL NOT NULL, last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS groups (
    id INTEGER PRIMARY KEY AUTOINCREMENT, env_id INTEGER, size INTEGER NOT NULL,
    policy_version INTEGER, state TEXT NOT NULL DEFAULT 'queued', batch_step INTEGER,
    created REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS groups_state ON groups(state, id);
CREATE TABLE IF NOT EXISTS pushes (key TEXT PRIMARY KEY, digest TEXT NOT NULL, group_id INTEGER);
"""

QUEUED, SERVED, STALE, LEASED = "queued", "served", "stale", "leased"
KEEP_KEYS = 100_000  # idempotency keys remembered (a retry comes within seconds or minutes)
# what push_many says of each group
NEW, DUPLICATE, CONFLICT = "queued", "duplicate", "conflict"


class AckError(ValueError):
    """`take_batch(ack=N)` for a batch that was never handed out."""


class _Pending:
    """One `push_many` call waiting for a group commit."""

    def __init__(self, groups, max_queued, keys):
        self.groups, self.max_queued, self.keys = groups, max_queued, keys
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


class GroupStore:
    def __init__(self, path: str | os.PathLike, keep_served: int = 1000):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self.keep_served = keep_served
        self._lock = threading.Lock()
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # --- key/value (registration, counters) -------------------------------------------
    def get(self, key: str, default: Any = None) -> Any:
        with self._lock:
            row = self._db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def set(self, **values: Any) -> None:
        with self._lock, self._tx():
            for k, v in values.items():
                self._db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES (?, ?)", (k, json.dumps(v)))

    def _tx(self):
        db = self._db

        class _Tx:
            def __enter__(self):
                db.execute("BEGIN IMMEDIATE")

            def __exit__(self, exc_type, *_):
                db.execute("ROLLBACK" if exc_type else "COMMIT")
        return _Tx()

    # --- environments -----------------------------------------------------------------
    def add_env(self, desired_name: str, max_token_length: int, weight: float, group_size: int,
                min_batch_allocation: float | None) -> dict[str, Any]:
        now = time.time()
        with self._lock, self._tx():
            env_id = self._db.execute("SELECT COUNT(*) FROM envs").fetchone()[0]
            same = self._db.execute("SELECT COUNT(*) FROM envs WHERE desired_name=?", (desired_name,)).fetchone()[0]
            real = f"{desired_name}_{same}"
            self._db.execute("INSERT INTO envs VALUES (?,?,?,?,?,?,?,?,?,?)",
                             (env_id, desired_name, real, max_token_length, weight, group_size,
                              min_batch_allocation, 1, now, now))
        return {"env_id": env_id, "real_name": real}

    def envs(self) -> list[dict[str, Any]]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM envs ORDER BY env_id")
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r)) for r in cur.fetchall()]

    def touch_env(self, env_id: int, connected: bool | None = None) -> bool:
        with self._lock, self._tx():
            if connected is None:
                cur = self._db.execute("UPDATE envs SET last_seen=? WHERE env_id=?", (time.time(), env_id))
            else:
                cur = self._db.execute("UPDATE envs SET last_seen=?, connected=? WHERE env_id=?",
                                       (time.time(), int(connected), env_id))
            return cur.rowcount > 0

    # --- groups -----------------------------------------------------------------------
    def push_many(self, groups: list[tuple[str | dict[str, Any], int | None, int, int | None]],
                  max_queued: int | None = None,
                  keys: list[tuple[str, str] | None] | None = None) -> list[tuple[str, int | None]] | None:
        """Queue (body, env_id, size, policy_version) groups in one transaction: None (nothing
        queued) if the new ones would put more than `max_queued` groups in the queue, else per
        group (NEW, id), (DUPLICATE, id of the first) or (CONFLICT, None). `keys`: per group
        None or (idempotency key, digest of its body); a key seen before is a DUPLICATE with
        the same digest, a CONFLICT with another (neither is queued). Committed with every
        other push waiting for the lock (group commit), each checked in turn."""
        me = _Pending(groups, max_queued, keys)
        with self._pending_lock:
            self._pending.append(me)
        with self._lock:
            if not me.done.is_set():  # nobody committed it while we waited: commit every waiting push
                with self._pending_lock:
                    batch, self._pending = self._pending, []
                try:
                    with self._tx():
                        for p in batch:
                            p.result = self._push_one(p)
                        self._prune_keys()
                except BaseException as exc:  # rolled back: nothing of the batch is queued
                    for p in batch:
                        p.result, p.error = None, exc
                for p in batch:
                    p.done.set()
        if me.error is not None:
            raise me.error
        return me.result

    def seen_keys(self, prefix: str) -> dict[str, str]:
        """{key: digest} of the idempotency keys pushed before that start with `prefix`."""
        with self._lock:  # a range of the primary key: prefix <= key < prefix with its last char + 1
            rows = self._db.execute("SELECT key, digest FROM pushes WHERE key >= ? AND key < ?",
                                    (prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))).fetchall()
        return dict(rows)

    def _push_one(self, p: _Pending) -> list[tuple[str, int | None]] | None:
        db, now = self._db, time.time()
        keys = p.keys or [None] * len(p.groups)
        seen: list[tuple[str, int | None] | None] = []
        for k in keys:
            row = None if k is None else db.execute("SELECT digest, group_id FROM pushes WHERE key=?",
                                                    (k[0],)).fetchone()
            seen.append(None if row is None else (DUPLICATE if row[0] == k[1] else CONFLICT, row[1]))
        fresh = [i for i, s in enumerate(seen) if s is None]
        if p.max_queued is not None and fresh:
            queued = db.execute("SELECT COUNT(*) FROM groups WHERE state=?", (QUEUED,)).fetchone()[0]
            if queued + len(fresh) > p.max_queued:
                return None
        out: list[tuple[str, int | None]] = []
        for i, ((body, env_id, size, version), k) in enumerate(zip(p.groups, keys)):
            if seen[i] is not None:
                out.append(seen[i] if seen[i][0] == DUPLICATE else (CONFLICT, None))
                continue
            text = body if isinstance(body, str) else json.dumps(body)
            gid = db.execute(
                "INSERT INTO groups(env_id, size, policy_version, state, created, body) VALUES (?,?,?,?,?,?)",
                (env_id, size, version, QUEUED, now, text)).lastrowid
            if k is not None:
                db.execute("INSERT INTO pushes(key, digest, group_id) VALUES (?,?,?)", (k[0], k[1], gid))
            out.append((NEW, gid))
        return out

    def _prune_keys(self) -> None:
        last = self._db.execute("SELECT MAX(rowid) FROM pushes").fetchone()[0]
        if last is not None and last > KEEP_KEYS:
            self._db.execute("DELETE FROM pushes WHERE rowid <= ?", (last - KEEP_KEYS,))

    def counts(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT state, COUNT(*), COALESCE(SUM(size), 0) FROM groups GROUP BY state").fetchall()
        out = {f"{s}_groups": 0 for s in (QUEUED, SERVED, STALE, LEASED)} | {"queued_sequences": 0}
        for state, n, seqs in rows:
            out[f"{state}_groups"] = n
            if state == QUEUED:
                out["queued_sequences"] = seqs
        return out

    def queued_meta(self) -> list[tuple[int, int | None, int, int | None]]:
        """(id, env_id, size, policy_version) of every queued group, oldest first."""
        with self._lock:
            return self._db.execute("SELECT id, env_id, size, policy_version FROM groups WHERE state=? ORDER BY id",
                                    (QUEUED,)).fetchall()

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM groups ORDER BY id DESC LIMIT 1").fetchone()
        return None if row is None else json.loads(row[0])

    def take_batch(self, batch_size: int, step: int, version: int | None = None,
                   max_staleness: int | None = None, *, encode: Callable | None = None,
                   ack: int | None = None, after: int | None = None) -> Any:
        """Oldest-first whole groups summing to exactly `batch_size` sequences, or None if the
        queue cannot form one yet. Queued groups older than `version - max_staleness` are
        marked stale first (kept, counted). Returns (groups, groups newly marked stale), or
        with `encode(groups, stale, batch_id)` what it returns, computed inside the
        transaction: if encoding raises, nothing is marked (no batch is lost to a response
        that could not be written).

        Without `ack` the groups are marked served (delivered once). With `ack` delivery is
        tied to the caller's checkpoints: every batch up to batch_id `ack` is acknowledged
        (`acknowledge`: its groups become served, never handed out again; 0 for none), and
        the oldest batch handed out but not acknowledged with a batch_id above `after`
        (default `ack`: the batch_id of the last batch the caller holds) is handed out again
        (same batch_id, same groups, `leased`) before any new one is formed. So a trainer
        that acknowledges what its newest checkpoint trained and, after a crash, resumes from
        it (`after` = that checkpoint's batch_id) is served the batches since, in order, again.
        An `ack` or `after` never handed out (or `after` < `ack`) raises AckError (nothing
        changed)."""
        with self._lock, self._tx():
            stale = 0
            if version is not None and max_staleness is not None and max_staleness >= 0:
                stale = self._db.execute(
                    "UPDATE groups SET state=? WHERE state=? AND policy_version IS NOT NULL AND policy_version < ?",
                    (STALE, QUEUED, version - max_staleness)).rowcount
            batch_id = None
            if ack is not None:
                after = ack if after is None else after
                self._check_ack(ack, after)
                self._acknowledge(ack)
                leased = self._db.execute("SELECT id, batch_step FROM groups WHERE state=? AND batch_step>? "
                                          "ORDER BY batch_step, id", (LEASED, after)).fetchall()
                if leased:  # an unacknowledged batch the caller does not hold: the same again
                    batch_id = leased[0][1]
                    picked = [gid for gid, b in leased if b == batch_id]
            if batch_id is None:
                picked, total = [], 0
                for gid, size in self._db.execute("SELECT id, size FROM groups WHERE state=? ORDER BY id",
                                                  (QUEUED,)).fetchall():
                    if total + size <= batch_size:  # greedy, oldest first; a group that does not fit waits
                        picked.append(gid)
                        total += size
                        if total == batch_size:
                            break
                if total != batch_size:
                    return encode(None, stale, None) if encode is not None else (None, stale)
                marks = ",".join("?" * len(picked))
                self._db.execute(f"UPDATE groups SET state=?, batch_step=? WHERE id IN ({marks})",
                                 (SERVED if ack is None else LEASED, step, *picked))
                self._db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES ('current_step', ?)",
                                 (json.dumps(step),))
                batch_id = step if ack is not None else None
                if batch_id is not None:
                    self._db.execute("INSERT OR REPLACE INTO kv(key, value) VALUES ('last_batch_id', ?)",
                                     (json.dumps(batch_id),))
            marks = ",".join("?" * len(picked))
            rows = self._db.execute(f"SELECT id, body, policy_version FROM groups WHERE id IN ({marks}) ORDER BY id",
                                    picked).fetchall()
            if self.keep_served:
                self._db.execute("DELETE FROM groups WHERE state=? AND id NOT IN (SELECT id FROM groups WHERE state=? "
                                 "ORDER BY id DESC LIMIT ?)", (SERVED, SERVED, self.keep_served))
            groups = []
            for gid, body, pv in rows:
                g = json.loads(body)
                g["policy_version"], g["group_id"] = pv, gid  # the id: what the trainer's ledger records
                groups.append(g)
            if encode is not None:
                return encode(groups, stale, batch_id)  # raises inside the transaction: rolled back
        return groups, stale

    def acknowledge(self, ack: int) -> int:
        """Every batch up to batch_id `ack` is trained and checkpointed: its groups become
        served (never handed out again). Returns how many groups were newly acknowledged;
        AckError (nothing changed) for an `ack` never handed out."""
        with self._lock, self._tx():
            self._check_ack(ack, ack)
            return self._acknowledge(ack)

    def _acknowledge(self, ack: int) -> int:
        return self._db.execute("UPDATE groups SET state=? WHERE state=? AND batch_step<=?",
                                (SERVED, LEASED, ack)).rowcount

    def _check_ack(self, ack: int, after: int) -> None:
        """AckError unless `ack` <= `after` are 0 (nothing held) or batch_ids handed out (at most the last one)."""
        row = self._db.execute("SELECT value FROM kv WHERE key='last_batch_id'").fetchone()
        last = json.loads(row[0]) if row else 0
        leased = self._db.execute("SELECT MAX(batch_step) FROM groups WHERE state=?", (LEASED,)).fetchone()[0]
        last = max(last, leased or 0)  # a store from before last_batch_id was kept
        for name, value in (("ack", ack), ("after", after)):
            if value < 0 or value > last:
                raise AckError(f"{name}={value}: no batch with that batch_id was handed out (the last one was {last}; "
                               f"0: none held yet); nothing was acknowledged")
        if after < ack:
            raise AckError(f"after={after} < ack={ack}: the caller cannot hold less than it acknowledged; "
                           f"nothing was acknowledged")

    def reset(self) -> None:
        with self._lock, self._tx():
            for table in ("kv", "envs", "groups"):
                self._db.execute(f"DELETE FROM {table}")
