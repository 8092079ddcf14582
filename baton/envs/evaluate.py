"""Held-out evaluation of a policy on a task, through any engine that speaks the protocol.

Greedy accuracy says what the policy "knows"; sampled accuracy (temperature 1, n samples
per prompt, averaged) is what GRPO sees and optimises, so both are reported.
"""

from __future__ import annotations

from typing import Any

from baton.data.rows import render_prompt
from baton.envs.base import Row, Task
from baton.protocol import Engine, SamplingParams


def evaluate(
    engine: Engine,
    tokenizer: Any,
    task: Task,
    rows: list[Row],
    greedy: bool,
    n: int = 4,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    seed: int = 0,
    grammar: str | None = None,
) -> dict[str, float]:
    """Accuracy of `engine`'s completions on `rows`: {"accuracy", "stop_rate", "samples"}.
    grammar: the constraint the run's completions are sampled under (rollout.response_format).

    greedy=True takes one temperature-0 completion per prompt (n is ignored); otherwise n
    seeded samples per prompt at `temperature`, and accuracy is the mean over all of them.
    A completion cut off by `max_new_tokens` counts as wrong even if its text matches.
    """
    if not rows:
        raise ValueError("evaluate needs at least one row")
    # a chat-message prompt through the tokenizer's template (which holds its own special tokens)
    prompts = [tokenizer(render_prompt(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    params = SamplingParams(
        n=1 if greedy else n,
        temperature=0.0 if greedy else temperature,
        max_new_tokens=max_new_tokens,
        seed=seed,
        grammar=grammar,
    )
    done = engine.generate(prompts, params)
    texts = tokenizer.batch_decode([c.token_ids for c in done], skip_special_tokens=True)
    correct = stopped = 0
    for c, text in zip(done, texts):
        ok_stop = c.finish_reason == "stop"
        stopped += ok_stop
        correct += ok_stop and task.is_correct(text, rows[c.prompt_index])
    return {"accuracy": correct / len(done), "stop_rate": stopped / len(done), "samples": float(len(done))}


MODES = ("greedy", "sampled")


def evaluate_modes(
    engine: Engine,
    tokenizer: Any,
    task: Task,
    rows: list[Row],
    n: int = 4,
    max_new_tokens: int = 16,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """Held-out evaluation, greedy then sampled (`n` per prompt at `temperature`), as
    metrics: `eval/accuracy_<mode>`, `eval/stop_rate_<mode>`, `eval/samples_<mode>` for
    mode in MODES. What every driver and `baton eval` report."""
    out: dict[str, float] = {}
    for mode in MODES:
        res = evaluate(engine, tokenizer, task, rows, greedy=mode == "greedy", n=n,
                       max_new_tokens=max_new_tokens, temperature=temperature, seed=seed)
        out.update({f"eval/{key}_{mode}": value for key, value in res.items()})
    return out
