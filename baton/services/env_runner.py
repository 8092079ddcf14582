"""`baton env NAME`: run an environment against inference server(s) and the trajectory API.

    baton env arithmetic --api http://127.0.0.1:8000 --server http://127.0.0.1:8001 \\
        [--server URL ...] [--dialect baton|sglang|vllm] [--concurrency 4] [--group-size 8]
    baton env gsm8k --api URL --server URL --data train.jsonl [--eval-data test.jsonl]

What it does: registers with the API (`/register-env`, waiting for a trainer as Atropos envs
do), then `--concurrency` workers each loop: wait while the API's queue is full or, when the
trainer bounds staleness by S, while max(S, 1) batches are queued or in flight (admission: no
group is sampled that the API could not take or would find too old), take the environment's next item, sample
a group of `--group-size` completions from a server (round-robin over `--server`s; token
ids in and out over `/generate` for baton's and SGLang's servers, OpenAI `/v1/completions`
with token-id prompts for vLLM's: `--dialect`), score it, and push it to `/scored_data`
with the behaviour logprobs and the server's policy (weight) version.

Faults: a server or API that is down, restarting or answering 5xx/429 is retried with
exponential backoff (capped at 5 s) for as long as it takes, logged once per outage; a
group the API refuses (4xx: malformed, or staler than the trainer accepts) is logged with
the reason and counted, and the worker goes on. If the API forgets this environment (a
fresh database), it registers again. SIGTERM / SIGINT: no new groups are started, the ones
in flight finish (up to --grace-s), `/disconnect-env` is sent, and it exits 0.

A one-line summary goes to stderr every --log-every-s: groups pushed / refused, retries,
mean score, verifier timeouts, the last policy version seen.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import httpx

from baton.services.client import APIClient, APIError, Stopped

log = logging.getLogger("baton.env")


class EnvRunner:
    def __init__(self, env: Any, api: APIClient, engines: list[Any], *, concurrency: int = 4,
                 max_groups: int | None = None, weight: float = 1.0, log_every_s: float = 30.0,
                 stop: threading.Event | None = None):
        self.env, self.api, self.engines = env, api, engines
        self.concurrency, self.max_groups, self.weight, self.log_every_s = concurrency, max_groups, weight, log_every_s
        self.stop = stop or api.stop
        self.env_id: int | None = None
        self._lock = threading.Lock()
        self._rr = itertools.cycle(range(len(engines)))
        self._status: tuple[float, dict] | None = None
        self.in_flight = 0  # groups admitted and not yet pushed (or dropped)
        self.counts = {"pushed": 0, "refused": 0, "generate_retries": 0, "score_sum": 0.0, "scored": 0,
                       "last_version": None}

    # --- registration and admission ----------------------------------------------------
    def register(self) -> int:
        out = self.api.register_env(name=self.env.name, group_size=self.env.group_size,
                                    max_token_length=self.env.max_token_length, weight=self.weight)
        self.env_id = out["env_id"]
        log.warning("env %s: registered with %s as env_id %d (%s)", self.env.name, self.api.url, self.env_id,
                    out.get("wandb_name"))
        return self.env_id

    def status(self) -> dict:
        """The API's /status-env, shared by the workers for 0.2 s; re-registers if the API
        no longer knows this env."""
        with self._lock:
            now = time.monotonic()
            if self._status is not None and now - self._status[0] < 0.2:
                return self._status[1]
            try:
                s = self.api.status_env(self.env_id)
            except APIError as exc:
                if exc.status != 404:
                    raise
                log.warning("env %s: the API does not know env_id %s (%s); registering again",
                            self.env.name, self.env_id, exc.detail)
                self.register()
                s = self.api.status_env(self.env_id)
            self._status = (now, s)
            return s

    def room(self, s: dict) -> int | None:
        """How many groups may be queued or in flight: the API's bound, and with a
        staleness bound S >= 1 no more than S batches (1 when S = 0): a batch sampled while
        the trainer trains on the one before is one version old when it is pulled; more
        ahead than that would only be marked stale."""
        room = s.get("max_queue")
        batch, staleness = s.get("batch_size") or -1, s.get("max_staleness")
        if staleness is not None and staleness >= 0 and batch > 0:
            ahead = max(1, staleness) * max(1, batch // max(1, self.env.group_size))
            room = ahead if room is None else min(room, ahead)
        return room

    def wait_for_room(self) -> None:
        said = False
        while not self.stop.is_set():
            s = self.status()
            room = self.room(s)
            with self._lock:
                busy = self.in_flight
            if room is None or s.get("queue_size", 0) + busy < room:
                with self._lock:
                    self.in_flight += 1
                return
            if not said:
                log.info("env %s: API queue full (%s/%s groups): waiting", self.env.name, s.get("queue_size"), room)
                said = True
            self.stop.wait(0.5)
        raise Stopped("stopping")

    # --- one group ---------------------------------------------------------------------
    def generate(self, item: dict) -> Any:
        backoff, outage = 0.25, None
        while True:
            if self.stop.is_set():
                raise Stopped("stopping")
            i = next(self._rr)
            engine = self.engines[i]
            try:
                group = self.env.collect(item, engine)
                if outage is not None:
                    log.warning("env %s: server %s answers again after %.1f s", self.env.name,
                                engine.base_url or i, time.monotonic() - outage)
                return group
            except (httpx.HTTPError, OSError, RuntimeError) as exc:
                if isinstance(exc, Stopped):
                    raise
                # RemoteEngineError (a RuntimeError): 4xx other than 429 is a bug, not an outage
                text = str(exc)
                if " -> 4" in text and " -> 429" not in text:
                    raise
                if outage is None:
                    outage = time.monotonic()
                    log.warning("env %s: server %s failed (%s: %s); retrying with backoff", self.env.name,
                                engine.base_url or i, type(exc).__name__, text[:300])
                with self._lock:
                    self.counts["generate_retries"] += 1
                if self.stop.wait(backoff):
                    raise Stopped("stopping") from None
                backoff = min(backoff * 2, 5.0)

    def push(self, group: Any) -> bool:
        try:
            self.api.push(group.to_scored_data(self.env_id))
        except APIError as exc:
            if exc.status == 404 or (exc.status == 422 and "env" in str(exc.detail)):
                raise
            with self._lock:
                self.counts["refused"] += 1
            log.warning("env %s: the API refused a group (%d): %s", self.env.name, exc.status, exc.detail)
            return False
        with self._lock:
            self.counts["pushed"] += 1
            self.counts["score_sum"] += sum(group.scores)
            self.counts["scored"] += len(group.scores)
            self.counts["last_version"] = group.policy_version
            if self.max_groups is not None and self.counts["pushed"] >= self.max_groups:
                self.stop.set()
        return True

    def worker(self) -> None:
        while not self.stop.is_set():
            try:
                self.wait_for_room()
            except Stopped:
                return
            try:
                with self._lock:
                    item = self.env.next_item()
                self.push(self.generate(item))
            except Stopped:
                return
            except Exception:  # noqa: BLE001 - one bad item must not end the service
                log.exception("env %s: a group failed; going on", self.env.name)
                self.stop.wait(1.0)
            finally:
                with self._lock:
                    self.in_flight -= 1

    def summary(self) -> str:
        c = self.counts
        mean = c["score_sum"] / c["scored"] if c["scored"] else float("nan")
        scorer = getattr(self.env, "scorer", None)
        extra = f", verifier timeouts {scorer.timeouts}, errors {scorer.errors}" if scorer is not None else ""
        return (f"env {self.env.name}[{self.env_id}]: pushed {c['pushed']} groups, refused {c['refused']}, "
                f"generate retries {c['generate_retries']}, API retries {self.api.retries}, mean score {mean:.3f}, "
                f"policy version {c['last_version']}{extra}")

    def run(self, grace_s: float = 30.0) -> dict:
        self.register()
        threads = [threading.Thread(target=self.worker, name=f"env-worker-{i}", daemon=True)
                   for i in range(self.concurrency)]
        for t in threads:
            t.start()
        last = time.monotonic()
        while not self.stop.wait(0.2):
            if time.monotonic() - last >= self.log_every_s:
                log.warning("%s", self.summary())
                last = time.monotonic()
            if not any(t.is_alive() for t in threads):
                break
        deadline = time.monotonic() + grace_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.stop.set()
        try:
            if self.env_id is not None:
                self.api.stop = threading.Event()  # one last call even though we are stopping
                self.api.disconnect(self.env_id)
        except Exception as exc:  # noqa: BLE001 - the API may be gone; nothing to tell it then
            log.warning("env %s: disconnect-env failed: %s", self.env.name, exc)
        log.warning("%s (stopped)", self.summary())
        return dict(self.counts)


def parse_env_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="baton env", description="Run an environment against servers and the API.")
    ap.add_argument("name", nargs="?", help="environment name (baton.envs.ENVIRONMENTS: arithmetic, gsm8k, ...)")
    ap.add_argument("--env", default=None, help="a user environment module:Class (or give it as NAME)")
    ap.add_argument("--api", required=True, help="trajectory API URL (baton api, or Atropos's)")
    ap.add_argument("--server", action="append", required=True, help="inference server URL; repeatable")
    ap.add_argument("--dialect", default="baton", choices=["baton", "sglang", "vllm"],
                    help="server API: baton/sglang /generate (token ids), vllm = OpenAI /v1/completions")
    ap.add_argument("--tokenizer", default=None, help="tokenizer dir (default: the server's model path)")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=4, help="groups in flight at once")
    ap.add_argument("--weight", type=float, default=1.0, help="this env's share of batches (Atropos env weight)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="", help="data file (gsm8k: GSM8K jsonl or verl parquet)")
    ap.add_argument("--eval-data", default="", help="held-out data file")
    ap.add_argument("--verifier-timeout-s", type=float, default=5.0, help="gsm8k: deadline of one verification")
    ap.add_argument("--max-groups", type=int, default=None, help="stop after pushing this many groups")
    ap.add_argument("--grace-s", type=float, default=30.0, help="on SIGTERM, how long in-flight groups may finish")
    ap.add_argument("--log-every-s", type=float, default=30.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (tokenizer only; no model here)")
    args = ap.parse_args(argv)
    if bool(args.name) == bool(args.env):
        ap.error("give an environment: NAME or --env module:Class (one of them)")
    args.name = args.name or args.env
    return args


def _tokenizer_path(args: argparse.Namespace, api_key: str | None, stop: threading.Event) -> str:
    if args.tokenizer:
        return args.tokenizer
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    backoff = 0.25
    while True:  # the server may still be starting
        try:
            r = httpx.get(f"{args.server[0].rstrip('/')}/get_model_info", headers=headers, timeout=10)
            r.raise_for_status()
            path = r.json().get("tokenizer_path") or r.json().get("model_path")
            if not path or not os.path.isdir(path):
                raise SystemExit(f"baton env: the server's model path {path!r} is not a local directory: "
                                 f"give --tokenizer")
            return path
        except (httpx.HTTPError, ValueError) as exc:
            log.warning("env: waiting for server %s (%s)", args.server[0], exc)
            if stop.wait(backoff):
                raise SystemExit(0) from None
            backoff = min(backoff * 2, 5.0)


def env_main(argv: list[str] | None = None) -> int:
    args = parse_env_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s", stream=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    import torch

    from baton.envs import make_environment
    from baton.models.load import load_tokenizer
    from baton.rollout.remote import RemoteEngine

    torch.set_num_threads(max(1, args.threads))
    server_key = os.environ.get("BATON_API_KEY") or None
    tokenizer = load_tokenizer(_tokenizer_path(args, server_key, stop))
    options: dict[str, Any] = dict(group_size=args.group_size, temperature=args.temperature, top_p=args.top_p,
                                   seed=args.seed)
    if args.max_new_tokens is not None:
        options["max_new_tokens"] = args.max_new_tokens
    if args.name == "gsm8k":
        options.update(data=args.data, eval_data=args.eval_data, timeout_s=args.verifier_timeout_s)
    elif args.data:
        raise SystemExit(f"baton env: --data is for file-backed environments (gsm8k), not {args.name!r}")
    env = make_environment(args.name, tokenizer, **options)
    env.setup()
    engines = [RemoteEngine(url, dialect=args.dialect, timeout=600.0) for url in args.server]
    api = APIClient(args.api, token=os.environ.get("BATON_API_TOKEN") or None, stop=stop, name=f"env {args.name}")
    runner = EnvRunner(env, api, engines, concurrency=args.concurrency, max_groups=args.max_groups,
                       weight=args.weight, log_every_s=args.log_every_s, stop=stop)
    try:
        runner.run(grace_s=args.grace_s)
    except Stopped:
        pass
    finally:
        scorer = getattr(env, "scorer", None)
        if scorer is not None:
            scorer.close()
        for e in engines:
            e.close()
        api.close()
    return 0


if __name__ == "__main__":
    sys.exit(env_main())
