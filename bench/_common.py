"""Shared parts of the benchmarks: the one import of the RL training driver, and smoke mode.

Every script under bench/ takes `--smoke`: tiny sizes and 1-2 steps, so that
tests/test_bench_smoke.py can run each one in seconds and none rots unnoticed.
Scripts run as `python bench/<name>.py`, so bench/ is on sys.path and they import this
module as `_common`.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "checkpoints" / "arith-sft"

# Recipe overrides that shrink a training run to a smoke test: 2 prompts x 2 samples x 4 tokens.
SMOKE_TRAIN = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
               "data.eval_size=2",
               "actor.mini_batch_size=0", "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false"]
# PPO with its critic (a critic-free method's `critic=null` would lose these keys: use SMOKE_TRAIN)
SMOKE_PPO = [*SMOKE_TRAIN, "critic.pretrain_steps=0", "critic.mini_batch_size=0"]


def driver(algorithm: str = "grpo") -> tuple[Callable[[Any], Any], type]:
    """(train, config class) of baton's driver for `algorithm` (baton.trainers.algorithms).

    The only place bench/ imports a trainer."""
    from baton.trainers.algorithms import config_class
    from baton.trainers.algorithms import driver as train_of

    return train_of(algorithm), config_class(algorithm)


def load_rl_config(algorithm: str, recipe: str | Path | None, overrides: list[str]) -> Any:
    """The driver's config for `algorithm`, loaded from a recipe with dotted overrides."""
    from baton.config import load_config

    return load_config(driver(algorithm)[1], None if recipe is None else str(recipe), overrides)


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, 1-2 steps: only checks that the script runs (CI)")


def tiny_model(preset: str = "0.75m") -> str:
    """A random tiny HF checkpoint in a fresh temp dir (smoke runs do not need the trained demo model)."""
    from baton.models.make import make_tiny_checkpoint

    return str(make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "model", preset=preset))
