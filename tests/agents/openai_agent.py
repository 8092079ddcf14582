"""An agent written against the OpenAI API only (the official `openai` client), as a user
would write it: `data.source: gateway` runs it unchanged (tests/agents/test_gateway_source.py).
It asks the question, and when the answer is wrong says so and asks once more; the reward is
1 for a right final answer."""

from __future__ import annotations

import openai


async def solve(base_url: str, api_key: str, row: dict) -> float:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = [{"role": "user", "content": row["prompt"]}]
    for _ in range(2):
        reply = await client.chat.completions.create(model="baton", messages=messages, max_tokens=6,
                                                     temperature=1.0)
        text = reply.choices[0].message.content or ""
        if text.strip() == row["answer"]:
            return 1.0
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": row["prompt"]}]
    await client.close()
    return 0.0


def not_async(base_url: str, api_key: str, row: dict) -> float:
    return 0.0
