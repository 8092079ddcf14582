"""The environment adapters' recipes run for 2 small steps (tests/envs/test_<extra>.py, marker
`envs_extra`): the metrics of the steps that trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def two_steps(recipe: Path, run_dir: Path) -> list[dict[str, Any]]:
    from baton.cli import main
    from baton.metrics import read_metrics

    assert main(["train", str(recipe), "trainer.steps=2", f"trainer.run_dir={run_dir}", "data.prompts_per_step=4",
                 "data.eval_size=4", "actor.mini_batch_size=0", "actor.micro_batch_size=32",
                 "trainer.progress=false"]) == 0
    steps = [r for r in read_metrics(run_dir) if "actor/loss" in r]
    assert len(steps) == 2 and all(0 <= s["reward/mean"] <= 1 for s in steps)
    return steps
