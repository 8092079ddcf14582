"""Does `stream=True` stream? Time to the first content chunk against the whole answer.

    .venv/bin/python bench/streaming.py [--model checkpoints/calc-sft] [--tokens 72] [--reps 5]

One client asks `baton serve` (the command, in a process of its own, on the shipped
checkpoint, --threads 1) for a `--tokens`-token chat answer (greedy, ignore_eos) with the official chunk format
(httpx reading the event stream). Reported, medians over --reps:
  non-streamed          the whole answer's time (before streaming streamed, a stream's
                        first chunk came then too), and a 1-token answer's (a prefill
                        over HTTP: the floor of a first chunk)
  streamed              time to the first content chunk, the whole stream's time, and
                        the content chunks
  engine                one prefill (max_tokens=1) and one decode step (the rest / tokens-1),
                        engine.generate in process (the goal: the first chunk within a
                        prefill plus a few decode steps)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

from baton.models.load import load_model, load_tokenizer
from baton.rollout.embedded.engine import EmbeddedEngine
from baton.protocol import SamplingParams
from _common import REPO, add_smoke  # bench/_common.py (scripts run from bench/ on sys.path)

MESSAGES = [{"role": "user", "content": "What is 12 + 30?"}]


def _stream(client: httpx.Client, tokens: int) -> tuple[float, float, int, str]:
    """(time to the first content chunk, whole time, content chunks, text)."""
    body = {"messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "ignore_eos": True, "stream": True}
    start, first, parts = time.perf_counter(), None, []
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            text = choices[0].get("delta", {}).get("content")
            if text:
                first = first if first is not None else time.perf_counter() - start
                parts.append(text)
    return first, time.perf_counter() - start, len(parts), "".join(parts)


def _plain(client: httpx.Client, tokens: int) -> tuple[float, str]:
    body = {"messages": MESSAGES, "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    start = time.perf_counter()
    r = client.post("/v1/chat/completions", json=body)
    return time.perf_counter() - start, r.json()["choices"][0]["message"]["content"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(REPO / "checkpoints" / "calc-sft"))
    ap.add_argument("--tokens", type=int, default=72)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    add_smoke(ap)
    args = ap.parse_args()
    if args.smoke:
        args.tokens, args.reps = 8, 1
    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model, dtype=torch.float32, device="cpu").eval(), load_tokenizer(args.model)
    engine = EmbeddedEngine(model, tok)
    server = subprocess.Popen([sys.executable, "-m", "baton.cli", "serve", args.model, "--port", "0", "--threads",
                               str(args.threads), "--dtype", "float32", "--device", "cpu"],
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    client, med = None, statistics.median
    try:
        url = next(found.group(1) for line in server.stdout  # "baton serve: NAME on http://HOST:PORT (...)"
                   if (found := re.search(r"on (http://\S+) ", line)))
        client = httpx.Client(base_url=url, timeout=600)  # one client: a new one costs ~0.1 s (SSL context)
        prompt = list(tok(tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True),
                          add_special_tokens=False)["input_ids"])

        def gen(n: int) -> float:
            t = time.perf_counter()
            engine.generate([prompt], SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True))
            return time.perf_counter() - t

        gen(args.tokens)  # warm-up
        prefill = med([gen(1) for _ in range(args.reps)])
        step = (med([gen(args.tokens) for _ in range(args.reps)]) - prefill) / max(args.tokens - 1, 1)
        print(f"{Path(args.model).name}: a {args.tokens}-token chat answer ({len(prompt)}-token prompt), greedy, "
              f"torch threads={args.threads}, median of {args.reps}")
        print(f"  engine: prefill {prefill * 1e3:.1f} ms, decode step {step * 1e3:.1f} ms")
        plain, one, runs = [], [], []
        for _ in range(args.reps):  # interleaved: a loaded machine's drift hits all three alike
            plain.append(_plain(client, args.tokens))
            one.append(_plain(client, 1)[0])
            runs.append(_stream(client, args.tokens))
        assert all(text == plain[0][1] for *_, text in runs), "a stream's text differs from the answer"
        whole_plain, floor = med(t for t, _ in plain), med(one)
        first, whole = med(r[0] for r in runs), med(r[1] for r in runs)
        print(f"  {'non-streamed':24s} whole answer {whole_plain * 1e3:7.1f} ms (the first chunk's time before "
              f"streaming streamed)")
        print(f"  {'non-streamed, 1 token':24s} whole answer {floor * 1e3:7.1f} ms (a prefill over HTTP)")
        print(f"  {'streamed':24s} first chunk {first * 1e3:7.1f} ms ({(first - floor) / step:4.1f} decode steps "
              f"after the 1-token answer; {first / whole_plain:.0%} of the whole answer), whole {whole * 1e3:7.1f} "
              f"ms, {med(r[2] for r in runs):.0f} chunks")
    finally:
        if client is not None:
            client.close()
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
