"""Does `baton api` stay responsive under load? 200 clients x 10 pushes, and one 60 MB list.

    .venv/bin/python bench/api_load.py [--clients 200] [--pushes 10] [--list-mb 60] [--smoke]
                                       [--api-path DIR]   (another checkout's baton: before/after)

`baton api` runs as its own process (`python -m baton.services.api`, real SQLite with
synchronous=FULL, in a temp dir). A prober, another process, GETs /health every 50 ms and
records each latency. Two phases:

  pushes   --clients concurrent clients (httpx.AsyncClient, one connection each), each
           POSTing --pushes groups to /scored_data one after another (gzip >= 1 KB, as
           Atropos envs), each with its own Idempotency-Key; reported: push latency p50 /
           p99 / max, pushes/s, and the /health latencies during the phase
  list     one POST /scored_data_list of about --list-mb MB of groups (gzip), reported: its
           time and the /health latencies while it was in flight

A /health that took longer than --probe-timeout-s counts as a miss (its latency is that
bound). Figures depend on the machine's load: compare runs side by side only.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from _common import REPO, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)


def _group(seed: int, n: int, length: int) -> dict:
    prompt = [5 + (seed + j) % 50 for j in range(length // 2)]
    toks, masks = [], []
    for i in range(n):
        resp = [100 + (seed * 7 + i + j) % 900 for j in range(length - len(prompt))]
        toks.append(prompt + resp)
        masks.append([-100] * len(prompt) + resp)
    return {"tokens": toks, "masks": masks, "scores": [float(i % 2) for i in range(n)], "env_id": None}


def _body(obj) -> tuple[bytes, dict]:
    raw = json.dumps(obj).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": uuid.uuid4().hex}
    if len(raw) >= 1024:
        raw, headers["Content-Encoding"] = gzip.compress(raw, compresslevel=1), "gzip"
    return raw, headers


def _probe(url: str, period_s: float, timeout_s: float, ready, stop, out) -> None:
    """The prober process: /health latencies (s) until `stop` is set."""
    lat = []
    with httpx.Client(base_url=url, timeout=timeout_s) as c:
        c.get("/health")
        ready.set()
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                ok = c.get("/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            lat.append(time.perf_counter() - t0 if ok else timeout_s)
            time.sleep(period_s)
    out.put(lat)


class Prober:
    def __init__(self, url: str, timeout_s: float):
        ctx = mp.get_context("spawn")
        self.ready, self.stop, self.out = ctx.Event(), ctx.Event(), ctx.Queue()
        self.p = ctx.Process(target=_probe, args=(url, 0.05, timeout_s, self.ready, self.stop, self.out), daemon=True)

    def __enter__(self) -> "Prober":
        self.p.start()
        if not self.ready.wait(120):  # the prober is up before the load starts
            raise RuntimeError("the /health prober did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.latencies = self.out.get(timeout=60)
        self.p.join(timeout=10)


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


async def _pushes(url: str, clients: int, pushes: int, n: int, length: int) -> tuple[list[float], list[int]]:
    bodies = [[_body(_group(k * pushes + j, n, length)) for j in range(pushes)] for k in range(clients)]

    async def client(k: int) -> tuple[list[float], list[int]]:
        lat, codes = [], []
        async with httpx.AsyncClient(base_url=url, timeout=120) as c:
            for raw, headers in bodies[k]:
                t0 = time.perf_counter()
                try:
                    r = await c.post("/scored_data", content=raw, headers=headers)
                    codes.append(r.status_code)
                except httpx.HTTPError:
                    codes.append(-1)
                lat.append(time.perf_counter() - t0)
        return lat, codes

    results = await asyncio.gather(*[client(k) for k in range(clients)])
    return [x for lat, _ in results for x in lat], [x for _, codes in results for x in codes]


def start_api(db: Path, max_queue: int, path: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    p = subprocess.Popen([sys.executable, "-m", "baton.services.api", "--port", "0", "--db", str(db),
                          "--max-queue", str(max_queue)], stdout=subprocess.PIPE, text=True, env=env,
                         cwd=db.parent)  # not this checkout: `-m` would import its baton before PYTHONPATH's
    url = p.stdout.readline().split()[2]
    for _ in range(600):
        try:
            httpx.get(f"{url}/health", timeout=1)
            return p, url
        except httpx.TransportError:
            time.sleep(0.05)
    raise RuntimeError("baton api did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--pushes", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--list-mb", type=float, default=60)
    ap.add_argument("--probe-timeout-s", type=float, default=60)
    ap.add_argument("--api-path", default=str(REPO),
                    help="PYTHONPATH of the API process (e.g. an export of another commit's baton/)")
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.clients, args.pushes, args.list_mb, args.probe_timeout_s = 8, 2, 1, 10
    one = len(json.dumps(_group(0, args.group_size, args.seq_len)))
    n_list = max(1, int(args.list_mb * 2**20 / one))
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        p, url = start_api(Path(tmp) / "api.sqlite", max_queue=args.clients * args.pushes + n_list + 10,
                           path=args.api_path)
        try:
            r = httpx.post(f"{url}/register", json={"batch_size": args.group_size, "max_token_len": 4096})
            assert r.status_code == 200, r.text
            print(f"baton api under load: {args.clients} clients x {args.pushes} pushes of a {args.group_size} x "
                  f"{args.seq_len}-token group ({one / 1024:.1f} KB JSON), then one list of {n_list} groups "
                  f"({n_list * one / 2**20:.0f} MB); /health probed every 50 ms from another process")
            with Prober(url, args.probe_timeout_s) as probe:
                t0 = time.perf_counter()
                lat, codes = asyncio.run(_pushes(url, args.clients, args.pushes, args.group_size, args.seq_len))
                wall = time.perf_counter() - t0
            bad = [c for c in codes if c != 200]
            print(f"pushes: {len(lat)} in {wall:.1f} s ({len(lat) / wall:.0f}/s), p50 {_pct(lat, .5):.2f} s, "
                  f"p99 {_pct(lat, .99):.2f} s, max {max(lat):.2f} s; not 200: {len(bad)} {sorted(set(bad))}")
            h = probe.latencies
            print(f"/health during pushes: {len(h)} probes, p50 {_pct(h, .5) * 1e3:.0f} ms, p99 "
                  f"{_pct(h, .99) * 1e3:.0f} ms, max {max(h) * 1e3:.0f} ms")
            raw, headers = _body([_group(10**6 + i, args.group_size, args.seq_len) for i in range(n_list)])
            with Prober(url, args.probe_timeout_s) as probe:
                t0 = time.perf_counter()
                r = httpx.post(f"{url}/scored_data_list", content=raw, headers=headers, timeout=600)
                wall = time.perf_counter() - t0
            assert r.status_code == 200, r.text[:500]
            h = probe.latencies
            print(f"list of {n_list} groups: {wall:.1f} s; /health meanwhile: {len(h)} probes, p50 "
                  f"{_pct(h, .5) * 1e3:.0f} ms, max {max(h) * 1e3:.0f} ms")
            queued = httpx.get(f"{url}/status").json()["queued_groups"]
            assert queued == len(lat) - len(bad) + n_list, (queued, len(lat), len(bad), n_list)
            print(f"queued: {queued} groups (every 200 queued once)")
        finally:
            p.terminate()
            p.wait(timeout=30)


if __name__ == "__main__":
    main()
