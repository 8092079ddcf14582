"""baton.metrics: plain progress lines without a terminal, and report.png's panels (every
metric kind the run has, none empty)."""

import json

from baton.metrics import MetricsLogger, progress_line, report_panels, write_report


def test_without_a_terminal_a_line_every_few_steps(tmp_path, capsys):
    log = MetricsLogger(tmp_path, 10, console=True, lines=None, line_every=4)  # pytest's stdout is no tty
    for step in range(0, 11):
        log.log(step, {"reward/mean": 0.5, "actor/loss": 0.25, "timing/step_s": 0.1})
    log.close()
    out = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert [ln.split()[1] for ln in out] == ["1/10", "4/10", "8/10", "10/10"]
    assert "reward 0.500" in out[0] and "loss 0.2500" in out[0] and "step 0.10s" in out[0] and "eta" in out[0]
    assert "eta" not in out[-1]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 11


def test_progress_line_shows_what_the_step_has():
    line = progress_line(3, 9, {"rewards/margins": 1.5, "rewards/accuracies": 0.75}, 30.0)
    assert line == "step 3/9  margin 1.500  pref_acc 0.750  eta 1m00s"
    # the KLs named for what they are: to the reference (the penalty's) and to the sampling policy
    line = progress_line(3, 9, {"actor/loss": 0.1, "actor/kl": 0.02, "actor/approx_kl": 0.001}, 0.0)
    assert line == "step 3/9  loss 0.1000  kl_ref 0.0200  kl_old 0.0010"
    # SFT and reward-model runs show their loss (and the RM its pair accuracy)
    assert progress_line(2, 4, {"sft/loss": 1.25, "eval/accuracy_greedy": 0.5}, 0.0) == "step 2/4  loss 1.2500  eval 0.500"
    assert progress_line(2, 4, {"rm/loss": 0.5, "rm/accuracy": 0.75, "eval/accuracy": 0.625}, 0.0) == \
        "step 2/4  loss 0.5000  pair_acc 0.750  eval 0.625"


GRPO = {"reward/mean": 0.4, "actor/loss": 0.1, "actor/approx_kl": 0.01, "actor/entropy": 1.2,
        "response/length_mean": 3.0}
DPO = {"actor/loss": 0.6, "rewards/margins": 0.3, "rewards/chosen": 0.1, "rewards/rejected": -0.2,
       "rewards/accuracies": 0.6, "dpo/kl": 0.02}


def test_report_panels_follow_the_metrics():
    grpo = [{"step": s, **GRPO} for s in range(1, 4)] + [{"step": 3, "eval/accuracy_greedy": 0.5}]
    titles = [t for t, _, _ in report_panels(grpo)]
    assert titles == ["training reward", "held-out accuracy", "loss", "KL", "entropy", "response length"]
    dpo = [{"step": s, **DPO} for s in range(1, 4)]
    titles = [t for t, _, _ in report_panels(dpo)]
    assert "training reward" not in titles  # offline DPO has no reward: no empty panel
    assert titles == ["loss", "KL", "DPO margins", "DPO preference accuracy"]
    ppo = [{"step": 1, **GRPO, "critic/vf_loss": 0.3, "critic/explained_var": 0.2}]
    panels = dict((t, k) for t, k, _ in report_panels(ppo))
    assert panels["loss"] == ["actor/loss", "critic/vf_loss"] and "critic explained variance" in panels


def test_agent_panels_and_no_pg_loss_line_under_an_identical_loss():
    agent = [{"step": s, "reward/mean": 0.5, "actor/loss": 0.1 * s, "actor/pg_loss": 0.1 * s,
              "agent/turns_mean": 2.5, "agent/turn_reward_mean": 0.2, "agent/dropped/env_error": s,
              "agent/dropped/env_timeout": 1} for s in range(1, 4)]
    panels = dict((t, k) for t, k, _ in report_panels(agent))
    assert panels["loss"] == ["actor/loss"]  # pg_loss equals the loss at every step: one line
    assert panels["agent turns"] == ["agent/turns_mean"] and panels["agent turn reward"] == ["agent/turn_reward_mean"]
    assert panels["agent: dropped trajectories"] == ["agent/dropped/env_error", "agent/dropped/env_timeout"]
    agent[1]["actor/pg_loss"] = 0.15  # a KL or entropy term: the two differ, both drawn
    assert dict((t, k) for t, k, _ in report_panels(agent))["loss"] == ["actor/loss", "actor/pg_loss"]


def test_write_report_draws_the_panels(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, **DPO}) + "\n" for s in range(1, 5)))
    out = write_report(tmp_path)
    assert out.stat().st_size > 0
