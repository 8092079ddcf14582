"""An HTTP client of the trajectory API (`baton api`, or Atropos's own server), with retries.

    client = APIClient("http://127.0.0.1:8000", token=None)
    client.register(batch_size=64, max_token_len=512, ...)   # the trainer
    client.push(group)                                        # an environment (gzip >= 1 KB)
    client.batch(version=3, max_staleness=2)                  # -> list of groups or None

What is retried, and how: a connection error, a timeout or a 5xx is retried with
exponential backoff (0.25 s doubling to `max_backoff_s`) until `retry_for_s` has passed
(None: for ever, until `stop` is set); a 429 waits its Retry-After. A 4xx other than 429 is
the caller's mistake and raises `APIError` with the server's reason at once. Every wait is
logged once per outage ("API unreachable ... retrying"), and once when it is back.

Pushes carry an `Idempotency-Key` (a fresh one per push, the same on each of its retries):
a push that timed out after the API had queued it is not queued again by its retry.
"""

from __future__ import annotations

import gzip
import json
import logging
import threading
import time
import uuid
from typing import Any

import httpx

log = logging.getLogger("baton.services.client")


class APIError(RuntimeError):
    def __init__(self, status: int, detail: Any, path: str):
        self.status, self.detail, self.path = status, detail, path
        super().__init__(f"{path} -> {status}: {detail}")


class APIUnavailable(RuntimeError):
    pass


class Stopped(RuntimeError):
    """`stop` was set while waiting."""


class APIClient:
    def __init__(self, url: str, token: str | None = None, *, timeout: float = 30.0, retry_for_s: float | None = None,
                 max_backoff_s: float = 5.0, stop: threading.Event | None = None, name: str = "client"):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout, self.retry_for_s, self.max_backoff_s = timeout, retry_for_s, max_backoff_s
        self.stop = stop or threading.Event()
        self.name = name
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)
        self.retries = 0  # requests that were retried (connection errors, 5xx, 429)

    def close(self) -> None:
        self._http.close()

    # --- plumbing -----------------------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, *, params: dict | None = None,
                compress_over: int | None = 1024, retry_for_s: float | None | str = "default",
                idempotent: bool = False) -> Any:
        """JSON in, JSON out, retried as the module docstring says. `idempotent`: send an
        Idempotency-Key, the same on every retry (the API queues the push once)."""
        retry_for = self.retry_for_s if retry_for_s == "default" else retry_for_s
        content, headers = None, {"Idempotency-Key": uuid.uuid4().hex} if idempotent else {}
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
            if compress_over is not None and len(content) >= compress_over:  # as Atropos envs do
                content, headers["Content-Encoding"] = gzip.compress(content, compresslevel=1), "gzip"
        deadline = None if retry_for is None else time.monotonic() + retry_for
        backoff, outage = 0.25, None
        while True:
            if self.stop.is_set():
                raise Stopped(f"{method} {path}: stopping")
            try:
                r = self._http.request(method, path, content=content, headers=headers, params=params)
                if r.status_code < 400:
                    if outage is not None:
                        log.warning("%s: %s is back after %.1f s", self.name, self.url, time.monotonic() - outage)
                    return r.json() if r.content and "json" in r.headers.get("content-type", "") else r.text
                if r.status_code == 429:
                    wait = _retry_after(r.headers.get("retry-after"), backoff)
                    why = f"429 {_detail(r)}"
                elif r.status_code >= 500:
                    wait, why = backoff, f"{r.status_code} {_detail(r)}"
                else:
                    raise APIError(r.status_code, _detail(r), f"{method} {path}")
            except (httpx.TransportError, httpx.TimeoutException) as exc:
                wait, why = backoff, f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if deadline is not None and now + wait > deadline:
                raise APIUnavailable(f"{method} {self.url}{path}: gave up after {retry_for:g} s ({why})")
            if outage is None:
                outage = now
                log.warning("%s: %s %s%s failed (%s); retrying with backoff", self.name, method, self.url, path, why)
            self.retries += 1
            if self.stop.wait(wait):
                raise Stopped(f"{method} {path}: stopping")
            backoff = min(backoff * 2, self.max_backoff_s)

    # --- trainer ------------------------------------------------------------------------
    def register(self, *, batch_size: int, max_token_len: int, checkpoint_dir: str = "", save_checkpoint_interval: int = 0,
                 starting_step: int = 0, num_steps: int = -1, wandb_group: str = "", wandb_project: str = "",
                 max_staleness: int | None = None, group_size: int | None = None,
                 vocab_size: int | None = None) -> dict:
        """Register the trainer. `group_size` / `vocab_size` (optional): the API then refuses
        (422 naming the field) pushes the trainer could not train on."""
        extra = {k: v for k, v in (("group_size", group_size), ("vocab_size", vocab_size)) if v is not None}
        return self.request("POST", "/register", {**extra,
            "wandb_group": wandb_group, "wandb_project": wandb_project, "batch_size": batch_size,
            "max_token_len": max_token_len, "checkpoint_dir": checkpoint_dir,
            "save_checkpoint_interval": save_checkpoint_interval, "starting_step": starting_step,
            "num_steps": num_steps, "max_staleness": max_staleness})

    def batch(self, version: int | None = None, max_staleness: int | None = None, ack: int | None = None,
              after: int | None = None, **kw: Any) -> dict:
        """A batch ({"batch": [...] or None}). `ack`: every batch up to this `batch_id` is
        acknowledged (0: none): at-least-once delivery, an unacknowledged batch above `after`
        (default `ack`: the last one held) comes back until acked."""
        params = {k: v for k, v in (("version", version), ("max_staleness", max_staleness), ("ack", ack),
                                    ("after", after)) if v is not None}
        return self.request("GET", "/batch", params=params, **kw)

    def ack(self, batch_id: int, **kw: Any) -> dict:
        """Acknowledge every batch up to `batch_id` (a checkpoint holds their update)."""
        return self.request("POST", "/ack", params={"ack": batch_id}, **kw)

    def status(self, **kw: Any) -> dict:
        return self.request("GET", "/status", **kw)

    # --- environment --------------------------------------------------------------------
    def register_env(self, *, name: str, group_size: int, max_token_length: int, weight: float = 1.0,
                     min_batch_allocation: float | None = None) -> dict:
        """Register, waiting (1 s polls, as Atropos envs) until the trainer has started."""
        body = {"max_token_length": max_token_length, "desired_name": name, "weight": weight,
                "group_size": group_size, "min_batch_allocation": min_batch_allocation}
        said = False
        while True:
            out = self.request("POST", "/register-env", body)
            if out.get("status") == "success":
                return out
            if not said:
                log.warning("%s: waiting for a trainer to start pulling from %s (%s)", self.name, self.url,
                            out.get("status"))
                said = True
            if self.stop.wait(1.0):
                raise Stopped("register-env: stopping")

    def status_env(self, env_id: int) -> dict:
        return self.request("GET", "/status-env", {"env_id": env_id}, compress_over=None)

    def push(self, group: dict) -> Any:
        return self.request("POST", "/scored_data", group, idempotent=True)

    def push_list(self, groups: list[dict]) -> Any:
        return self.request("POST", "/scored_data_list", groups, idempotent=True)

    def disconnect(self, env_id: int) -> Any:
        return self.request("POST", "/disconnect-env", {"env_id": env_id}, retry_for_s=5.0)


def _detail(r: httpx.Response) -> Any:
    try:
        body = r.json()
        return body.get("detail", body) if isinstance(body, dict) else body
    except ValueError:
        return r.text[:500]


def _retry_after(value: str | None, default: float) -> float:
    try:
        return max(0.05, float(value)) if value is not None else default
    except ValueError:
        return default
