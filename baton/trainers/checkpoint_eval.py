"""`baton eval MODEL_DIR`: held-out accuracy of any checkpoint, agents included.

    baton eval CKPT [--task arithmetic] [--data F --eval-data F] [--n 200]    a task's held-out rows
    baton eval CKPT --recipe R.yaml [dotted.key=value ...] [--n N]            as the recipe evaluates

With `--recipe`, the task, the held-out rows (`data.task`, `data.path` / `data.eval_path`,
`data.eval_size`) and the generation length (`rollout.max_new_tokens`) are the recipe's, so
a checkpoint is scored as its run scored it; a recipe with `data.source: agent` runs the
agent's episodes greedily (`agent:` section: accuracy with the tool, well-formed calls, and
the accuracy without the tool, `baton.agents.evaluate`). Flags given on the command line
win over the recipe. Prints greedy and sampled (4 per prompt, T=1) accuracy for a task.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.config import ConfigError


@dataclass
class EvalPlan:
    task: str
    rows: list[dict[str, Any]]
    max_new_tokens: int
    agent: Any = None  # an AgentConfig: evaluate episodes
    data: Any = None  # the `data:` section whose files the rows come from (checked before the model loads)


def recipe_plan(recipe: str, overrides: list[str], n: int | None) -> EvalPlan:
    """What `--recipe` evaluates: the recipe's task, held-out rows and generation length."""
    from baton.config import load_config, merge_recipe
    from baton.envs import configured_task
    from baton.trainers.algorithms import DEFAULT, config_class
    from baton.trainers.session.config import DataConfig
    from baton.trainers.session.state import task_rows
    from baton.trainers.sft import SFTDataConfig, sft_rows

    merged = merge_recipe(recipe, [*overrides, *([f"data.eval_size={n}"] if n else [])])
    try:
        cfg = load_config(config_class(str(merged.get("algorithm", DEFAULT))), data=merged)
    except ValueError as e:  # an unknown algorithm
        raise ConfigError(str(e)) from None
    data = getattr(cfg, "data", None)
    if not isinstance(data, (DataConfig, SFTDataConfig)):
        raise ConfigError(f"recipe {recipe!r} (algorithm {cfg.algorithm}) has no task to evaluate on: baton eval "
                          f"scores a task's held-out rows (grpo, ppo, online_dpo, sft recipes)")
    if getattr(cfg, "gateway", None) is not None:
        raise ConfigError("a data.source=gateway recipe's agent is evaluated by its training run (eval/* in "
                          "metrics.jsonl): baton eval runs tasks and data.source=agent recipes")
    if not data.path:  # the task's held-out rows (no training split built just to be dropped)
        rows = configured_task(data.task, data.task_args).eval_rows(data.eval_size)
    else:
        rows = task_rows(data)[1] if isinstance(data, DataConfig) else sft_rows(data)[1]
    rollout = getattr(cfg, "rollout", None)
    return EvalPlan(task=data.task, rows=rows, max_new_tokens=rollout.max_new_tokens if rollout else 16,
                    agent=getattr(cfg, "agent", None), data=data)


def flags_plan(task: str, data: str, eval_data: str, n: int) -> EvalPlan:
    """What `--task` / `--data` / `--eval-data` evaluate."""
    from baton.envs import get_task
    from baton.data.records import DataError
    from baton.trainers.session.config import DataConfig
    from baton.trainers.session.state import task_rows

    section = DataConfig(task=task, path=data, eval_path=eval_data, eval_size=n)
    try:
        rows = task_rows(section)[1] if data or eval_data else get_task(task).eval_rows(n)
    except DataError:
        raise
    except (KeyError, ValueError, OSError) as e:  # unknown task, a file-backed task without --data
        raise ConfigError(str(e).replace("data.path / ", "")) from None
    return EvalPlan(task=task, rows=rows, max_new_tokens=16, data=section)


def evaluate_checkpoint(model_dir: str, plan: EvalPlan, seed: int = 0) -> str:
    """The report `baton eval` prints for `model_dir` under `plan`."""
    from baton.envs import get_task
    from baton.envs.evaluate import MODES, evaluate_modes
    from baton.models.load import load_model, load_tokenizer
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine

    if not plan.rows:
        raise ConfigError("no held-out rows to evaluate on (data.eval_size / --n is 0?)")
    from baton.models.precision import pick_device
    from baton.trainers.session.inputs import check_row_files

    if plan.data is not None:  # rows within the model's context: refused before it loads
        check_row_files(plan.data, model_dir, plan.max_new_tokens, split=False)

    # on the GPU when there is one (fp32 weights; the CPU as before otherwise)
    model, tokenizer = load_model(model_dir, device=pick_device("auto")), load_tokenizer(model_dir)
    engine = build_engine(DEFAULT_ENGINE, model, tokenizer, model_path=model_dir)
    if plan.agent is not None:
        from baton.agents.evaluate import agent_report, evaluate_agent

        return agent_report(model_dir, len(plan.rows), evaluate_agent(engine, tokenizer, plan.rows, plan.agent))
    result = evaluate_modes(engine, tokenizer, get_task(plan.task), plan.rows, n=4,
                            max_new_tokens=plan.max_new_tokens, seed=seed)
    lines = [f"{mode:8s} accuracy {result[f'eval/accuracy_{mode}']:.3f}  (stop rate "
             f"{result[f'eval/stop_rate_{mode}']:.3f}, {int(result[f'eval/samples_{mode}'])} samples "
             f"on {len(plan.rows)} held-out prompts)" for mode in MODES]
    if result["eval/timeouts"] or result["eval/errors"]:
        lines.append(f"verifier: {int(result['eval/timeouts'])} calls ran past their deadline, "
                     f"{int(result['eval/errors'])} failed (each scored wrong)")
    return "\n".join(lines)
