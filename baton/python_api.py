"""`baton.train(...)`: a run from Python, through the same path as `baton train` (docs/PYTHON_API.md).

    import baton
    run = baton.train("recipes/grpo_arithmetic.yaml", overrides={"trainer.steps": 20},
                      reward_funcs=[lambda completion, answer, **_: float(completion.strip() == answer)],
                      train_dataset=[{"prompt": "2+3=", "answer": "5"}, ...])
    print(run.accuracy, run.run_dir)
    print(run.generate(["4+4="]))

The recipe is a file, a mapping (a recipe's sections) or a typed config (`PPOConfig(...)`,
any algorithm's config class); `overrides` are dotted keys, as a dict of Python values or
`"key=value"` strings. `reward_funcs` (callables, registered names, or {fn: weight}) replace
`reward.functions` (baton/rewards/python.py: per row or batched, sync or async);
`train_dataset` / `eval_dataset` (a path, a list of dicts, a `datasets.Dataset`) become
`data.path` / `data.eval_path` (baton/data/inline.py). Then `build_recipe` and `run_built`
(baton/trainers/run_recipe.py) validate, place (placement.auto, as the CLI) and run the
driver in this process; a bad input raises ConfigError / DataError (ValueErrors, one line)
before anything is written. The result is a `TrainResult`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from baton.config import ConfigError


def _override_list(overrides: Any) -> list[str]:
    """Dotted overrides as `key=value` strings (a dict's values as JSON, which YAML reads back
    as the same value)."""
    if overrides is None:
        return []
    if isinstance(overrides, dict):
        return [f"{k}={json.dumps(v)}" for k, v in overrides.items()]
    if isinstance(overrides, str):
        raise ConfigError("overrides: a dict {'dotted.key': value} or a list of 'dotted.key=value' strings, "
                          "not one string")
    return [str(o) for o in overrides]


def _recipe_parts(recipe: Any) -> tuple[str | None, dict[str, Any] | None]:
    """(a recipe file, a mapping of sections) for a path, a mapping or a typed config."""
    import dataclasses

    from baton.config import to_dict

    if recipe is None:
        return None, None
    if isinstance(recipe, (str, os.PathLike)):
        return os.fspath(recipe), None
    if isinstance(recipe, dict):
        return None, dict(recipe)
    if dataclasses.is_dataclass(recipe) and not isinstance(recipe, type):
        return None, to_dict(recipe)
    raise ConfigError(f"recipe: a path, a dict or a config object (e.g. PPOConfig), got a {type(recipe).__name__}")


def _check_ray_can_send(cfg: Any) -> None:
    """A Python reward function that a Ray worker process would need but Ray cannot send
    (cloudpickle): one line, before the run starts."""
    placement = getattr(cfg, "placement", None)
    reward = getattr(cfg, "reward", None)
    if placement is None or reward is None or placement.backend != "ray":
        return
    from baton.controller.ray_backend import check_serializable
    from baton.rewards.python import shipped

    for name, fn in shipped(reward.functions).items():
        why = check_serializable(fn.fn)
        if why:
            raise ConfigError(f"reward function {name!r} cannot be sent to Ray worker processes "
                              f"(placement.backend=ray): {why}; use placement.backend=local, or a function "
                              f"that does not hold it")


def train(recipe: Any = None, *, overrides: Any = None, reward_funcs: Any = None, train_dataset: Any = None,
          eval_dataset: Any = None, algorithm: str | None = None) -> "TrainResult":
    """Train in this process and return the run (see the module docstring)."""
    from baton.data.inline import rows_file
    from baton.rewards.python import register_callables
    from baton.trainers.run_recipe import build_recipe, run_built
    from baton.user_modules import add_user_path

    add_user_path()  # `module:function` names resolve here and in worker processes, as under the CLI
    path, data = _recipe_parts(recipe)
    items = _override_list(overrides)
    keys = {o.split("=", 1)[0].strip() for o in items}
    for given, key in ((reward_funcs, "reward.functions"), (train_dataset, "data.path"),
                       (eval_dataset, "data.eval_path")):
        if given is not None and key in keys:
            raise ConfigError(f"{key} is given twice: as an override and as "
                              f"{ {'reward.functions': 'reward_funcs'}.get(key, key.replace('data.', '')) }")
    if algorithm is not None:
        items.append(f"algorithm={algorithm}")
    if reward_funcs is not None:
        items.append(f"reward.functions={json.dumps(register_callables(reward_funcs))}")
    if train_dataset is not None:
        items.append(f"data.path={json.dumps(rows_file(train_dataset, 'train_dataset'))}")
    if eval_dataset is not None:
        items.append(f"data.eval_path={json.dumps(rows_file(eval_dataset, 'eval_dataset'))}")
    name, cfg = build_recipe(path, items, data=data)
    _check_ray_can_send(cfg)
    metrics = run_built(name, cfg)
    return TrainResult(run_dir=Path(cfg.trainer.run_dir), config=cfg, metrics=dict(metrics or {}))


@dataclass
class TrainResult:
    """A finished run: where it is, its config, its final metrics, and its trained model.

    `accuracy` / `start_accuracy`: held-out greedy accuracy at the end / at step 0 (None
    for a run with no task accuracy); `history()`: every metrics.jsonl record; `checkpoint`:
    the newest complete checkpoint; `model` / `tokenizer`: loaded from it on first use;
    `generate(prompts)`: completions from it; `evaluate()`: held-out accuracy again."""

    run_dir: Path
    config: Any
    metrics: dict[str, Any]
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def accuracy(self) -> float | None:
        return self.metrics.get("eval/accuracy_greedy")

    @property
    def start_accuracy(self) -> float | None:
        return self.metrics.get("start/eval/accuracy_greedy")

    def history(self) -> list[dict[str, Any]]:
        from baton.metrics import read_metrics

        return read_metrics(self.run_dir)

    @property
    def checkpoint(self) -> Path:
        from baton.runs.checkpoints import latest_complete_checkpoint

        ckpt, _ = latest_complete_checkpoint(self.run_dir)
        if ckpt is None:
            raise FileNotFoundError(f"{self.run_dir}: no complete checkpoint")
        return ckpt

    def _load(self) -> dict[str, Any]:
        if not self._loaded:
            from baton.models.load import load_model, load_tokenizer
            from baton.rollout.engines import DEFAULT_ENGINE, build_engine

            path = str(self.checkpoint)
            model, tokenizer = load_model(path), load_tokenizer(path)
            self._loaded.update(model=model, tokenizer=tokenizer,
                                engine=build_engine(DEFAULT_ENGINE, model, tokenizer, model_path=path))
        return self._loaded

    @property
    def model(self) -> Any:
        return self._load()["model"]

    @property
    def tokenizer(self) -> Any:
        return self._load()["tokenizer"]

    def generate(self, prompts: list[Any] | str, max_new_tokens: int | None = None, temperature: float = 0.0,
                 seed: int = 0) -> list[str]:
        """The trained model's completion of each prompt (a string, or chat messages rendered
        with the tokenizer's template); greedy unless `temperature` > 0. `max_new_tokens`:
        the run's rollout.max_new_tokens by default."""
        from baton.data.records import prompt_ids
        from baton.protocol import SamplingParams

        loaded = self._load()
        one = isinstance(prompts, str)
        prompts = [prompts] if one else list(prompts)
        rollout = getattr(self.config, "rollout", None)
        limit = max_new_tokens or (rollout.max_new_tokens if rollout is not None else 64)
        tok = loaded["tokenizer"]
        done = loaded["engine"].generate([prompt_ids(tok, p) for p in prompts],
                                         SamplingParams(n=1, temperature=temperature, max_new_tokens=limit, seed=seed))
        by_prompt = sorted(done, key=lambda c: c.prompt_index)
        return tok.batch_decode([c.token_ids for c in by_prompt], skip_special_tokens=True)

    def evaluate(self, rows: list[dict[str, Any]] | None = None, seed: int = 0) -> dict[str, float]:
        """Held-out accuracy of the trained model, greedy and sampled (4 per prompt), on `rows`
        or on the run's held-out rows: what `baton eval CKPT --recipe` prints."""
        from baton.envs import configured_task
        from baton.envs.evaluate import evaluate_modes
        from baton.trainers.session.state import task_rows

        data = self.config.data
        task = configured_task(data.task, data.task_args)
        if rows is None:
            rows = task_rows(data)[1] if data.path else task.eval_rows(data.eval_size)
        loaded = self._load()
        return evaluate_modes(loaded["engine"], loaded["tokenizer"], task, rows, n=4,
                              max_new_tokens=self.config.rollout.max_new_tokens, seed=seed)
