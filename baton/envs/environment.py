"""Environments: what an environment service does, one group at a time.

    env = make_environment("arithmetic", tokenizer, group_size=8)
    env.setup()
    item = env.next_item()                      # a row: {"prompt": str | messages, "answer", ...}
    group = env.collect(item, engine)           # n samples through any `baton.protocol.Engine`
    scored = group.to_scored_data(env_id)       # Atropos ScoredData (+ policy_version)
    env.evaluate(engine)                        # held-out accuracy

The protocol (`Environment`): `setup()`, `next_item()`, `collect(item, engine)` (sample a
group of `group_size` completions and score them), `score(item, completions)`,
`evaluate(engine)`. The engine is anything that speaks `baton.protocol.Engine`: in a
`baton env` process a `RemoteEngine` over an inference server's /generate or OpenAI
completions (this layer sits below `baton.rollout` and never imports it).

`TaskEnvironment` is an environment over a baton Task (its rows, its verifier): the
arithmetic demo and GSM8K are two of them, with the same prompts and verifiers as the
embedded path, so an API run compares with an embedded one. A `ScoredGroup` keeps what a
trainer needs: tokens (prompt + completion), masks (-100 on prompt tokens, the token id on
completion tokens, Atropos's convention), scores, the engine's behaviour logprobs aligned to
the tokens (1.0 on prompt positions, as atroposlib), finish reasons, and the policy version
that sampled the group (the oldest, if its samples disagree).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from baton.data.prompts import PromptSampler
from baton.data.records import prompt_ids, render_prompt
from baton.envs.base import Row, Task
from baton.envs.evaluate import evaluate as evaluate_task
from baton.protocol import Engine, SamplingParams
from baton.registry import Registry


@dataclass
class ScoredGroup:
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    inference_logprobs: list[list[float]]
    finish_reasons: list[str]
    policy_version: int
    completions: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # per-group counters (e.g. verifier timeouts)

    def to_scored_data(self, env_id: int | None = None) -> dict[str, Any]:
        """The Atropos ScoredData dict, plus baton's `policy_version` and `finish_reasons`."""
        return {"tokens": self.tokens, "masks": self.masks, "scores": self.scores,
                "inference_logprobs": self.inference_logprobs, "env_id": env_id,
                "policy_version": self.policy_version, "finish_reasons": self.finish_reasons,
                "advantages": None, "ref_logprobs": None, "messages": None, "overrides": None,
                "generation_params": None, "group_overrides": {"policy_version": self.policy_version, **self.info},
                "images": None}


@runtime_checkable
class Environment(Protocol):
    name: str
    group_size: int
    max_token_length: int

    def setup(self) -> None: ...

    def next_item(self) -> Row: ...

    def collect(self, item: Row, engine: Engine) -> ScoredGroup: ...

    def score(self, item: Row, completions: list[str]) -> list[float]: ...

    def evaluate(self, engine: Engine) -> dict[str, float]: ...


class TaskEnvironment:
    """An environment over a Task's rows and verifier (see the module docstring).

    `score_fn(item, completions) -> scores` overrides the task's exact verifier (GSM8K
    scores through a process-sandboxed math verifier)."""

    def __init__(self, task: Task, tokenizer: Any, *, group_size: int = 8, max_new_tokens: int = 16,
                 temperature: float = 1.0, top_p: float = 1.0, seed: int = 0, eval_size: int = 200,
                 rows: list[Row] | None = None, eval_rows: list[Row] | None = None,
                 score_fn: Callable[[Row, list[str]], list[float]] | None = None, seeded: bool = False):
        if group_size < 1:
            raise ValueError(f"group_size must be >= 1, got {group_size}")
        self.task, self.tokenizer = task, tokenizer
        self.name = task.name
        self.group_size, self.max_new_tokens = group_size, max_new_tokens
        self.temperature, self.top_p, self.seed, self.eval_size = temperature, top_p, seed, eval_size
        self._rows, self._eval_rows, self._score_fn, self.seeded = rows, eval_rows, score_fn, seeded
        self.max_token_length = max_new_tokens
        self.sampler: PromptSampler | None = None
        self._rng = random.Random(seed)

    def setup(self) -> None:
        rows = self._rows if self._rows is not None else self.task.train_rows(seed=self.seed)
        self.sampler = PromptSampler(rows, seed=self.seed)
        longest = max(len(prompt_ids(self.tokenizer, r["prompt"])) for r in rows[:1000])
        self.max_token_length = longest + self.max_new_tokens

    def next_item(self) -> Row:
        if self.sampler is None:
            self.setup()
        return self.sampler.next_batch(1)[0]

    def sampling_params(self) -> SamplingParams:
        eos = getattr(self.tokenizer, "eos_token_id", None)
        # Unseeded unless asked: a server batches only unseeded requests with equal params
        # (a seed must give the same tokens whatever else is in flight).
        return SamplingParams(n=self.group_size, temperature=self.temperature, top_p=self.top_p,
                              max_new_tokens=self.max_new_tokens,
                              seed=self._rng.randrange(2**31) if self.seeded else None,
                              stop_token_ids=[eos] if eos is not None else [])

    def score(self, item: Row, completions: list[str]) -> list[float]:
        if self._score_fn is not None:
            return self._score_fn(item, completions)
        return [1.0 if self.task.is_correct(c, item) else 0.0 for c in completions]

    def collect(self, item: Row, engine: Engine) -> ScoredGroup:
        ids = prompt_ids(self.tokenizer, item["prompt"])
        done = sorted(engine.generate([ids], self.sampling_params()), key=lambda c: c.prompt_index)
        texts = self.tokenizer.batch_decode([c.token_ids for c in done], skip_special_tokens=True)
        scores = self.score(item, texts)
        return ScoredGroup(
            tokens=[ids + list(c.token_ids) for c in done],
            masks=[[-100] * len(ids) + list(c.token_ids) for c in done],
            scores=[float(s) for s in scores],
            inference_logprobs=[[1.0] * len(ids) + [float(x) for x in c.logprobs] for c in done],
            finish_reasons=[c.finish_reason for c in done],
            policy_version=min(c.version for c in done),
            completions=texts)

    def eval_rows(self) -> list[Row]:
        return self._eval_rows if self._eval_rows is not None else self.task.eval_rows(self.eval_size)

    def evaluate(self, engine: Engine) -> dict[str, float]:
        """Greedy held-out accuracy through `engine` (the task's exact verifier)."""
        rows = [{**r, "prompt": render_prompt(self.tokenizer, r["prompt"])} for r in self.eval_rows()]
        out = evaluate_task(engine, self.tokenizer, self.task, rows, greedy=True, max_new_tokens=self.max_new_tokens)
        counts = {f"eval/{k}": out.pop(k) for k in ("timeouts", "errors")}  # verifier calls that hung, raised
        return {**{f"eval/{k}_greedy": v for k, v in out.items()}, **counts}


# name -> factory(tokenizer, **options) -> Environment. Options every factory takes:
# group_size, max_new_tokens, temperature, seed; others are the environment's own
# (e.g. GSM8K's data path).
ENVIRONMENTS: Registry = Registry("environment")


def register_environment(name: str):
    return ENVIRONMENTS.register(name)


def make_environment(name: str, tokenizer: Any, **options: Any) -> Environment:
    """A registered environment, or a user's `module:Factory` (a class or function called as
    `factory(tokenizer, **options)`, imported by `baton.user_modules.load_object`)."""
    from baton.user_modules import is_spec, load_object

    factory = ENVIRONMENTS[name] if name in ENVIRONMENTS or not is_spec(name) else load_object(name, "environment")
    return factory(tokenizer, **options)


@register_environment("arithmetic")
def arithmetic_environment(tokenizer: Any, **options: Any) -> TaskEnvironment:
    """The CPU demo as a service: the arithmetic task's prompts and exact verifier (the same
    rows, in the same seeded order, as the embedded path's `data.task: arithmetic`)."""
    from baton.envs.base import get_task

    options.setdefault("max_new_tokens", 4)
    return TaskEnvironment(get_task("arithmetic"), tokenizer, **options)
