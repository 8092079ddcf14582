"""Queue health (baton/trainers/report/queue_health.py): hand-worked step metrics and the
bottleneck line, and the demo recipe's run (a few tiny steps through `baton train`) showing
the panels in report.png and the summary line at the end."""

from __future__ import annotations

import pytest
import torch

from baton import fields as F
from baton.batch import Batch
from baton.trainers.report.queue_health import QueueHealth, age_counts, matmul_rate, summary


def test_step_metrics_by_hand():
    # 4 rows, 3 response tokens each (12) + 2 prompt tokens each (8) = 20 tokens; two rows one version old
    batch = Batch({F.RESPONSE_MASK: torch.ones(4, 3), F.PROMPT_MASK: torch.ones(4, 2),
                   F.POLICY_VERSION: torch.tensor([5, 5, 4, 4])}, {}, {F.GENERATE_S: 0.5})
    times = {"timing/rollout_s": 0.5, "timing/score_s": 0.1, "timing/update_s": 1.2, "timing/sync_s": 0.2,
             "timing/eval_s": 9.0}  # evaluation is no step's work: left out of the 2.0 s
    m = QueueHealth(params=1000, rate=1e6).step(batch, times, version=5)
    close = lambda x: pytest.approx(x, rel=1e-12)  # noqa: E731 (the phases are summed in floats)
    assert m["throughput/rows_trained_per_s"] == close(4 / 2.0) and m["throughput/rows_generated_per_s"] == close(4 / 0.5)
    assert m["throughput/trainer_idle"] == close(0.4) and m["throughput/generator_idle"] == close(0.75)
    assert m["queue/age_counts"] == [2, 2]
    assert m["throughput/update_matmul_share"] == close(6 * 1000 * 20 / 1.2 / 1e6)  # 0.1
    fast = QueueHealth(params=1000, rate=1e3).step(batch, times, version=5)  # a rate measured while busy
    assert fast["throughput/update_matmul_share"] == 1.0  # the update's own rate is the machine's, at least


def test_age_counts_and_the_matmul_rate():
    assert age_counts(torch.tensor([0.0, 2.0, 2.0, 0.0, 1.0])) == [2, 1, 2]
    assert age_counts(torch.tensor([])) == []
    assert matmul_rate("cpu", threads=1, size=64, seconds=0.01) > 1e6  # any CPU does > 1 MFLOP/s


def test_the_summary_names_the_bottleneck():
    waits = [{"throughput/trainer_idle": 0.4, "throughput/generator_idle": 0.1, "throughput/rows_trained_per_s": 100.0,
              "throughput/rows_generated_per_s": 400.0, "queue/age_counts": [3, 1], "throughput/update_matmul_share": 0.25}]
    assert summary(waits) == ("queue: the trainer waited 40% of the time for rows: generation is the bottleneck "
                              "(100.0 rows/s trained, 400.0 rows/s generated; trained rows 0.25 versions old on "
                              "average, the update at 25% of the machine's matmul rate)")
    busy = [{"throughput/trainer_idle": 0.1, "throughput/generator_idle": 0.6, "throughput/rows_trained_per_s": 50.0}]
    assert summary(busy).startswith("queue: the generator waited 60% of the time for the trainer: the update is "
                                    "the bottleneck (50.0 rows/s trained; trained rows 0.00")
    assert summary([{"sft/loss": 1.0}]) == ""


def test_a_sync_run_logs_its_rates_but_shows_no_queue(tmp_path, capsys):
    """The demo alternates generating and training (trainer.mode=sync, one process): its
    throughput metrics are logged, but no queue line is printed and report.png draws no queue or
    staleness panels (they describe a queue it does not have); a run with a queue does."""
    from baton.cli import main
    from baton.metrics import AGE_PANEL, has_queue, read_metrics, report_panels

    run = tmp_path / "run"
    assert main(["train", "recipes/grpo_arithmetic.yaml", f"trainer.run_dir={run}", "trainer.steps=2",
                 "data.prompts_per_step=4", "rollout.n=2", "data.eval_size=2", "actor.mini_batch_size=0",
                 "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false"]) == 0
    out = capsys.readouterr().out
    assert "queue: " not in out, out[-1500:]
    rows = read_metrics(run)
    queued = {"queue: idle share", "queue: rows/s", AGE_PANEL}
    assert not queued & {t for t, _, _ in report_panels(rows, queue=False)}
    assert queued <= {t for t, _, _ in report_panels(rows)}  # what a run with a queue draws
    assert "update: share of the matmul rate" in {t for t, _, _ in report_panels(rows, queue=False)}
    steps = [r for r in rows if r.get("step", 0) >= 1 and "throughput/trainer_idle" in r]
    assert len(steps) == 2 and all(r["queue/age_counts"] == [8] for r in steps)  # on-policy: 8 rows of age 0
    assert all(0 < r["throughput/rows_generated_per_s"] and 0 <= r["throughput/generator_idle"] <= 1 for r in steps)
    assert (run / "report.png").stat().st_size > 0
    assert not has_queue("sync", "rollout") and not has_queue("sync", "agent")
    assert has_queue("one_step_off", "rollout") and has_queue("async", "agent") and has_queue("sync", "api")
