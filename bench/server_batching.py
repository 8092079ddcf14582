"""Does `baton serve` batch concurrent clients? 32 clients at once vs one batched call.
And does a short request wait for a long one? (`--case long-short`)

    .venv/bin/python bench/server_batching.py [--clients 32] [--new-tokens 32] [--reps 3]
    .venv/bin/python bench/server_batching.py --case long-short [--long-tokens 4000] [--reps 3]

Modes, same 32 prompts, same number of generated tokens (ignore_eos), medians over --reps:
  engine, one call          engine.generate(32 prompts) in process: the ceiling
  http, one request         one /generate request carrying all 32 prompts
  http, 32 concurrent       32 clients each sending one prompt at the same time (batched
                            by the server's window: --wait-ms)
  http, 32 concurrent w=0   the same with no batching window (batches form only from
                            requests that queue while the engine is busy)
  http, 32 sequential       one client, 32 requests one after another (no batching possible)
The server is a uvicorn thread in this process; clients are httpx.AsyncClient.

--case long-short: one client asks for --long-tokens (ignore_eos, greedy); once its
generation runs, another asks for 4 tokens. Reported: the short request's latency and
the long one's wall time, with generations run whole (--slice-steps 0: how the server
worked before it interleaved) and in slices of --slice-steps decode steps.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import threading
import time

import httpx
import torch

from baton.models.tiny import build_tiny_model, count_params
from baton.models.tokenizer import build_char_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from baton.rollout.server import ServerThread, build_app
from _common import add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)


def _prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(4, 200, (int(torch.randint(8, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


async def _concurrent(url: str, prompts, sp) -> None:
    limits = httpx.Limits(max_connections=len(prompts) + 4, max_keepalive_connections=len(prompts) + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        rs = await asyncio.gather(*[c.post("/generate", json={"input_ids": p, "sampling_params": sp}) for p in prompts])
    assert all(r.status_code == 200 for r in rs)


async def _sequential(url: str, prompts, sp) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        for p in prompts:
            assert (await c.post("/generate", json={"input_ids": p, "sampling_params": sp})).status_code == 200


def _one_request(url: str, prompts, sp) -> None:
    with httpx.Client(base_url=url, timeout=600) as c:
        assert c.post("/generate", json={"input_ids": prompts, "sampling_params": sp}).status_code == 200


def _long_short(url: str, srv, long_tokens: int) -> tuple[float, float]:
    """(short request's latency, long request's wall time), seconds."""
    done: dict[str, float] = {}

    def long_request() -> None:
        t0 = time.perf_counter()
        with httpx.Client(base_url=url, timeout=3600) as c:
            r = c.post("/generate", json={"input_ids": [5, 6, 7, 8], "sampling_params": {
                "temperature": 0, "max_new_tokens": long_tokens, "ignore_eos": True}})
        assert r.status_code == 200, r.text
        done["long"] = time.perf_counter() - t0

    t = threading.Thread(target=long_request)
    t.start()
    while srv.batcher.running == 0:  # the long generation has started
        time.sleep(0.001)
    with httpx.Client(base_url=url, timeout=3600) as c:
        t0 = time.perf_counter()
        r = c.post("/generate", json={"input_ids": [9, 10, 11], "sampling_params": {
            "temperature": 0, "max_new_tokens": 4, "ignore_eos": True}})
        short = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    t.join()
    return short, done["long"]


def long_short(args) -> None:
    tok = build_char_tokenizer()
    model = build_tiny_model(args.preset, seed=0, max_position=args.long_tokens + 16).eval()
    engine = EmbeddedEngine(model, tok, max_batch_tokens=max(65536, args.long_tokens + 16))
    print(f"\n{args.preset} Qwen2 ({count_params(model) / 1e6:.1f}M params): a {args.long_tokens}-token request, "
          f"then a 4-token one; torch threads={args.threads}, median of {args.reps}")
    print(f"{'generations':<26} {'short latency s':>16} {'long wall s':>12} {'engine calls':>13}")
    for slice_steps in (0, args.slice_steps):
        app = build_app(engine, tok, args.preset, max_batch_wait_ms=0, slice_steps=slice_steps,
                        max_request_tokens=max(65536, args.long_tokens))
        srv = app.state.baton
        with ServerThread(app) as server:
            _long_short(server.url, srv, 8)  # warm-up
            runs = [_long_short(server.url, srv, args.long_tokens) for _ in range(args.reps)]
        name = "whole (before)" if slice_steps == 0 else f"slices of {slice_steps} steps"
        print(f"{name:<26} {statistics.median(r[0] for r in runs):>16.3f} "
              f"{statistics.median(r[1] for r in runs):>12.2f} {srv.batcher.stats['slices']:>13}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--preset", default="5m")
    ap.add_argument("--wait-ms", type=float, default=5.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: on an oversubscribed CPU multi-threaded ops stall)")
    ap.add_argument("--case", choices=["clients", "long-short"], default="clients")
    ap.add_argument("--long-tokens", type=int, default=4000)
    ap.add_argument("--slice-steps", type=int, default=16)
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.clients, args.new_tokens, args.reps, args.preset, args.long_tokens = 3, 4, 1, "0.75m", 64
    torch.set_num_threads(args.threads)
    if args.case == "long-short" or args.smoke:
        long_short(args)
        if args.case == "long-short":
            return

    tok = build_char_tokenizer()
    model = build_tiny_model(args.preset, seed=0).eval()
    prompts = _prompts(args.clients)
    params = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, ignore_eos=True)
    sp = {"temperature": 1.0, "max_new_tokens": args.new_tokens, "ignore_eos": True}
    tokens = args.clients * args.new_tokens

    engine = EmbeddedEngine(model, tok)
    apps = {w: build_app(engine, tok, args.preset, max_batch_wait_ms=w) for w in (args.wait_ms, 0.0)}
    servers = {w: ServerThread(app) for w, app in apps.items()}
    modes = {
        "engine, one call": lambda: engine.generate(prompts, params),
        "http, one request": lambda: _one_request(servers[args.wait_ms].url, prompts, sp),
        f"http, {args.clients} concurrent w={args.wait_ms:g}ms":
            lambda: asyncio.run(_concurrent(servers[args.wait_ms].url, prompts, sp)),
        f"http, {args.clients} concurrent w=0":
            lambda: asyncio.run(_concurrent(servers[0.0].url, prompts, sp)),
        f"http, {args.clients} sequential": lambda: asyncio.run(_sequential(servers[args.wait_ms].url, prompts, sp)),
    }
    try:
        results = {}
        for name, fn in modes.items():
            fn()  # warm-up
            stats = [apps[w].state.baton.batcher.stats for w in apps]
            before = sum(s["batches"] for s in stats)
            times = []
            for _ in range(args.reps):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            calls = (sum(s["batches"] for s in stats) - before) / args.reps
            results[name] = (statistics.median(times), calls)
    finally:
        for s in servers.values():
            s.stop()

    print(f"\n{args.preset} Qwen2 ({count_params(model) / 1e6:.1f}M params), {args.clients} prompts x "
          f"{args.new_tokens} new tokens, T=1, torch threads={args.threads}, median of {args.reps}")
    print(f"{'mode':<34} {'wall s':>8} {'tokens/s':>9} {'engine calls':>13}")
    for name, (t, calls) in results.items():
        shown = "1" if name.startswith("engine") else f"{calls:g}"
        print(f"{name:<34} {t:>8.2f} {tokens / t:>9.0f} {shown:>13}")


if __name__ == "__main__":
    main()
