"""OpenAI-speaking agents that misbehave, for the gateway's deadline and failed-step tests
(tests/agents/test_deadlines.py, test_failed_draws.py): `data.source: gateway` loads them
as "faulty_agents:NAME" with this directory on sys.path."""

from __future__ import annotations

import threading

import httpx

RELEASE = threading.Event()  # set by a test when it is done: the blocked agents return


async def blocks_or_answers(base_url: str, api_key: str, row: dict) -> float:
    """A prompt starting with "block": blocks its event loop (no await) until released;
    any other: one chat turn, reward 1."""
    if row["prompt"].startswith("block"):
        RELEASE.wait(120)
        return 1.0
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=60) as client:
        r = await client.post("/chat/completions", json={"model": "baton", "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": row["prompt"]}]})
        r.raise_for_status()
    return 1.0


async def raises(base_url: str, api_key: str, row: dict) -> float:
    raise ZeroDivisionError("the agent's own bug")


async def never_samples(base_url: str, api_key: str, row: dict) -> float:
    return 1.0
