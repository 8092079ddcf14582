"""`baton rm`: a Bradley-Terry reward model trained from the shipped SFT warm start
(checkpoints/arith-sft, 0.82M params: it knows some arithmetic, which a random model would
first have to learn) ranks held-out pairs better than chance, is saved as a sequence-classification checkpoint, and is then what the
reward-model role scores with and what a critic can start from (its trained head)."""

import json

import pytest
import torch

from baton.batch import Batch
from baton.config import ConfigError, load_config
from baton.metrics import read_metrics
from baton.trainers.reward_model import RMConfig, bt_loss, run_rm, task_pairs, wrong_answer
from baton.workers.critic import load_value_model
from baton.workers.reward_model import RM_SCORE, RewardModelConfig, RewardModelWorker


SFT = "checkpoints/arith-sft"


def test_bt_loss_by_hand():
    # margins 2, -1: loss = (log(1 + e^-2) + log(1 + e^1)) / 2 = (0.126928 + 1.313262) / 2
    loss, stats = bt_loss(torch.tensor([3.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert loss.item() == pytest.approx(0.720095, abs=1e-5)
    assert stats == {"accuracy": 0.5, "margin": 0.5}


def test_wrong_answers_differ_from_the_target():
    import random
    rng = random.Random(0)
    for answer in ("7", "10", "45", "9"):
        for _ in range(20):
            w = wrong_answer(answer, rng)
            assert w != answer and len(w) == len(answer) and not (len(w) > 1 and w[0] == "0")
    assert all(p["chosen"] != p["rejected"] for p in task_pairs("arithmetic", 50, seed=1))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("rm")
    pairs = task_pairs("arithmetic", 600, seed=0)
    (out / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    cfg = load_config(RMConfig, overrides=[
        f"model.path={SFT}", f"data.path={out / 'pairs.jsonl'}", "data.eval_fraction=0.2",
        "trainer.steps=60", "trainer.batch_size=32", "optim.lr=3e-4", "optim.lr_warmup_steps=10",
        f"trainer.run_dir={out / 'run'}", f"trainer.save_path={out / 'model'}", "trainer.progress=false"])
    return out, run_rm(cfg)


def test_rm_training_learns_and_writes_its_run_dir(trained):
    out, result = trained
    assert result["start/eval/accuracy"] < 0.62  # chance, on 120 held-out pairs
    assert result["eval/accuracy"] > 0.7, result
    rows = read_metrics(out / "run")
    assert [r["step"] for r in rows] == list(range(61)) and "rm/accuracy" in rows[1]
    assert rows[0]["eval/accuracy"] == result["start/eval/accuracy"]
    samples = [json.loads(line) for line in (out / "run" / "samples.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in samples}) == [0, 60] and len(samples) == 16  # 8 held-out pairs, 2 evaluations
    assert all(set(r) >= {"prompt", "completion", "reward", "rejected", "rejected_reward"} for r in samples)
    last = [r for r in samples if r["step"] == 60]  # the trained model ranks most chosen answers first
    assert sum(r["reward"] > r["rejected_reward"] for r in last) >= 5
    from baton.metrics import report_panels
    panels = {t: k for t, k, _ in report_panels(rows)}
    assert "rm/loss" in panels["loss"] and "eval/accuracy" in panels["held-out accuracy"]
    assert (out / "run" / "config.yaml").exists() and (out / "model" / "model.safetensors").exists()


def test_the_reward_model_role_and_a_critic_load_it(trained):
    out, _ = trained
    worker = RewardModelWorker(RewardModelConfig(path=str(out / "model")))
    pairs = task_pairs("arithmetic", 200, seed=99)  # unseen
    batch = Batch(non_tensors={"prompt": [p["prompt"] for p in pairs] * 2,
                               "completion": [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs]})
    scores = worker.compute_rm_scores(batch)[RM_SCORE]  # called directly: the method itself
    assert (scores[:200] > scores[200:]).float().mean() > 0.7
    critic = load_value_model(str(out / "model"))
    assert torch.equal(critic.score.weight, worker.model.score.weight)  # the trained head


def test_rm_config_errors_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match="data.path"):
        load_config(RMConfig, overrides=[f"data.path={tmp_path / 'missing.jsonl'}"])
    (tmp_path / "bad.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2"}) + "\n")
    from baton.trainers.reward_model import load_pairs
    cfg = load_config(RMConfig, overrides=[f"data.path={tmp_path / 'bad.jsonl'}"])
    with pytest.raises(ValueError, match="bad.jsonl:1: field 'rejected' missing"):
        load_pairs(cfg.data)
