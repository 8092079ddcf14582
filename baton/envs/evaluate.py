"""Held-out evaluation of a policy on a task, through any engine that speaks the protocol.

Greedy accuracy says what the policy "knows"; sampled accuracy (temperature 1, n samples
per prompt, averaged) is what GRPO sees and optimises, so both are reported.

The task's verifier (`is_correct`) runs where training's rewards run: in the reward runner
(`baton.rewards.runner`, worker processes), under the same per-call deadline
(`reward.timeout_s`). A verifier that hangs or raises scores that sample 0, is counted
(`timeouts`, `errors`: the metrics `eval/timeouts`, `eval/errors`) and said in one line;
evaluation goes on. `TaskScorer` holds the runner (a caller that evaluates often keeps one).
"""

from __future__ import annotations

from typing import Any

from baton.data.records import render_prompt
from baton.envs.base import Row, Task
from baton.protocol import Engine, SamplingParams
from baton.rewards.runner import RewardRunner

VERDICT = "eval/is_correct"  # the verifier's name in the runner's one-line warnings


class Verdict:
    """A task's verifier as a reward function: 1.0 when `task.is_correct`, else 0.0. An object
    (not a closure), so a reward worker process loads it: the task is pickled with it."""

    def __init__(self, task: Task):
        self.task = task

    def __call__(self, prompt: Any, completion: str, **row: Any) -> float:
        return 1.0 if self.task.is_correct(completion, {"prompt": prompt, **row}) else 0.0

    def prepare(self) -> None:
        """The task's own `prepare()` (a slow import), at a worker's start, not under a deadline."""
        ready = getattr(self.task, "prepare", None)
        if callable(ready):
            ready()


class TaskScorer:
    """`task.is_correct` over completions, in a reward runner (deadline, error capture)."""

    def __init__(self, task: Task, timeout_s: float = 5.0, max_workers: int = 4):
        self.task = task
        self.runner = RewardRunner({VERDICT: 1.0}, timeout_s=timeout_s, max_workers=max_workers,
                                   callables={VERDICT: Verdict(task)})

    def score(self, completions: list[str], rows: list[Row]) -> tuple[list[bool], int, int]:
        """(correct per completion, calls timed out, calls failed); a failed call is wrong."""
        if not completions:
            return [], 0, 0
        totals, _, stats = self.runner.score([r["prompt"] for r in rows], completions,
                                             [{k: v for k, v in r.items() if k != "prompt"} for r in rows])
        return [t >= 1.0 for t in totals], sum(stats.timeouts), sum(stats.errors) + sum(stats.nonfinite)

    def close(self) -> None:
        self.runner.close()


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
    scorer: TaskScorer | None = None,
) -> dict[str, float]:
    """Accuracy of `engine`'s completions on `rows`: {"accuracy", "stop_rate", "samples",
    "timeouts", "errors"} (the last two: verifier calls that hung or raised, scored wrong).
    grammar: the constraint the run's completions are sampled under (rollout.response_format).
    scorer: the verifier's runner (default: one for this call, closed after it).

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
    stopped = [(text, rows[c.prompt_index]) for c, text in zip(done, texts) if c.finish_reason == "stop"]
    own = scorer is None
    scorer = TaskScorer(task) if own else scorer
    try:
        verdicts, timeouts, errors = scorer.score([t for t, _ in stopped], [r for _, r in stopped])
    finally:
        if own:
            scorer.close()
    return {"accuracy": sum(verdicts) / len(done), "stop_rate": len(stopped) / len(done),
            "samples": float(len(done)), "timeouts": float(timeouts), "errors": float(errors)}


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
    timeout_s: float = 5.0,
) -> dict[str, float]:
    """Held-out evaluation, greedy then sampled (`n` per prompt at `temperature`), as
    metrics: `eval/accuracy_<mode>`, `eval/stop_rate_<mode>`, `eval/samples_<mode>` for
    mode in MODES, and `eval/timeouts`, `eval/errors` (verifier calls, both modes).
    What every driver and `baton eval` report. timeout_s: each verifier call's deadline."""
    out: dict[str, float] = {"eval/timeouts": 0.0, "eval/errors": 0.0}
    scorer = TaskScorer(task, timeout_s=timeout_s)
    try:
        for mode in MODES:
            res = evaluate(engine, tokenizer, task, rows, greedy=mode == "greedy", n=n,
                           max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, scorer=scorer)
            for key in ("timeouts", "errors"):
                out[f"eval/{key}"] += res.pop(key)
            out.update({f"eval/{key}_{mode}": value for key, value in res.items()})
    finally:
        scorer.close()
    return out
