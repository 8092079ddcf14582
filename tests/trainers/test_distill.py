"""On-policy distillation through the PPO-family driver (`algo.advantage=distill`, a
`teacher:` section): the student moves toward its teacher, a teacher with another vocabulary
is refused before anything is written, combinations that make no sense are refused, resume
is exact, and the teacher runs on a Ray worker of its own.

Student: the shipped warm start checkpoints/arith-sft (greedy 0.475); teacher: the shipped
checkpoints/arith-grpo (the demo's GRPO result, greedy 0.895; the same shape and tokenizer)."""

import json
import shutil
from pathlib import Path

import pytest

from baton.cli import main
from baton.config import ConfigError, load_config
from baton.envs import TASKS, ArithmeticTask, register_task
from baton.metrics import read_metrics
from baton.trainers.ppo import train
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
STUDENT, TEACHER = str(REPO / "checkpoints/arith-sft"), str(REPO / "checkpoints/arith-grpo")
TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=2", "actor.micro_batch_size=8",
        "actor.mini_batch_size=8", "trainer.progress=false", "trainer.eval_every=0", f"model.path={STUDENT}"]
DISTILL = ["algo.advantage=distill", f"teacher.path={TEACHER}"]


def config(run_dir, *extra) -> PPOConfig:
    return load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml",
                       [*TINY, *DISTILL, f"trainer.run_dir={run_dir}", *extra])


def steps(run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["step"] > 0]


@pytest.mark.parametrize("loss", ["advantage", "reverse_kl"])
def test_the_student_moves_toward_its_teacher(tmp_path, loss):
    """On a fixed set of 16 prompts (as tests/trainers/test_grpo_learns.py: fresh prompts each
    step would bury a few steps' change in sampling noise), the per-token reverse KL to the
    teacher on the student's own samples falls over 8 steps, and the teacher's logprob of
    the student's tokens rises: with the sampled token's log ratio as the advantage, and with
    GKD's exact reverse KL over the whole vocabulary as the loss (algo.distill_loss)."""
    if "arithmetic-16" not in TASKS:
        register_task(ArithmeticTask(name="arithmetic-16", train_size=16))
    train(config(tmp_path, "trainer.steps=8", "data.task=arithmetic-16", "data.prompts_per_step=16", "rollout.n=4",
                 "actor.mini_batch_size=32", "actor.micro_batch_size=64", "actor.lr=1e-4", "actor.lr_warmup_steps=0",
                 f"algo.distill_loss={loss}"))
    rows = steps(tmp_path)
    if loss != "advantage":  # the loss term is the actor's, the advantage (no task term) is 0
        assert rows[0]["actor/distill_loss"] > 0 and rows[0]["actor/pg_loss"] == 0
    kl = [r["distill/reverse_kl"] for r in rows]
    teacher = [r["distill/teacher_logprob"] for r in rows]
    first, last = sum(kl[:2]) / 2, sum(kl[-2:]) / 2
    assert last < 0.7 * first, [round(k, 3) for k in kl]
    assert sum(teacher[-2:]) > sum(teacher[:2]), teacher
    assert 0 <= rows[0]["distill/teacher_below"] <= 1 and "reward/mean" in rows[0]  # the reward: a metric here


def _other_vocabulary(tmp_path) -> str:
    """The teacher with two token ids swapped in its tokenizer: same size, another vocabulary."""
    other = tmp_path / "teacher_other_vocab"
    shutil.copytree(TEACHER, other)
    tok = json.loads((other / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = [k for k, v in vocab.items() if v in (4, 5)]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(tok))
    return str(other)


def test_a_teacher_with_another_vocabulary_is_refused_before_anything_is_written(tmp_path, capsys):
    other = _other_vocabulary(tmp_path)
    run_dir = tmp_path / "run"
    code = main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), *TINY, "algo.advantage=distill",
                 f"teacher.path={other}", f"trainer.run_dir={run_dir}", "trainer.steps=1", "placement.auto=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"teacher.path={other}" in err[0] and f"model.path={STUDENT}" in err[0] and "vocabular" in err[0]
    assert not run_dir.exists()


def _padded_teacher(tmp_path) -> str:
    """The teacher with 40 more embedding rows (one tokenizer: a padded embedding, as
    Qwen2.5-7B's 152,064 rows beside 0.5B's 151,936), the new rows' logits the largest."""
    import torch
    from transformers import AutoModelForCausalLM

    padded = tmp_path / "teacher_padded"
    shutil.copytree(TEACHER, padded)
    model = AutoModelForCausalLM.from_pretrained(TEACHER)
    model.resize_token_embeddings(300)
    with torch.no_grad():  # tied head: rows 260.. point along every hidden state's mean, large
        model.get_input_embeddings().weight[260:] = 50.0
    model.save_pretrained(padded)
    return str(padded)


@pytest.mark.parametrize("loss,topk", [("reverse_kl", 4), ("forward_kl", 0), ("advantage", None)])
def test_a_teacher_with_a_padded_embedding_scores_over_the_students_vocabulary(tmp_path, loss, topk):
    """Issue 50.2: the padded rows are dropped and the rest renormalised, so the run is the run
    with the unpadded teacher (before: `index 260 is out of bounds for dimension 2 with size 260`)."""
    padded = _padded_teacher(tmp_path)
    extra = ["trainer.steps=1", f"algo.distill_loss={loss}"] + ([f"algo.distill_topk={topk}"] if topk is not None else [])
    train(config(tmp_path / "plain", *extra))
    train(config(tmp_path / "padded", *extra, f"teacher.path={padded}"))
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/", "memory/"))}
    a, b = steps(tmp_path / "plain"), steps(tmp_path / "padded")
    assert a[0].keys() == b[0].keys() and "distill/reverse_kl" in b[0]
    for key, value in drop(a[0]).items():
        assert b[0][key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_a_topk_above_the_vocabulary_is_refused_before_anything_is_written(tmp_path, capsys):
    """Issue 50.10: algo.distill_topk=1000 with a 260-token vocabulary was clamped without a word."""
    run_dir = tmp_path / "run"
    code = main(["train", str(REPO / "recipes/grpo_arithmetic.yaml"), *TINY, *DISTILL, "algo.distill_loss=reverse_kl",
                 "algo.distill_topk=1000", f"trainer.run_dir={run_dir}", "trainer.steps=1", "placement.auto=false"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "algo.distill_topk=1000 is more than the vocabulary" in err[0] and "(260 tokens)" in err[0], err
    assert not run_dir.exists()


@pytest.mark.parametrize("overrides,says", [
    (["algo.advantage=distill"], "teacher: section"),  # distill without a teacher
    ([f"teacher.path={TEACHER}"], "does not read a teacher"),  # a teacher nothing reads (grpo)
    (["algo.task_reward_coef=0.5"], "task_reward_coef"),  # the task weight without distill
    ([*DISTILL, "algo.task_reward_coef=-1"], "task_reward_coef"),
    ([*DISTILL, "algo.task_reward_coef=0.5", "reward.functions={}"], "nothing scores"),
    ([*DISTILL, "algo.task_reward_coef=0.5", "rollout.n=1"], "rollout.n=1"),  # its task term compares samples
    (["algo.advantage=distill", "teacher.bf16=false"], "teacher.path is required"),
    ([*DISTILL, "algo.distill_loss=kl"], "algo.distill_loss='kl' is not one of"),  # an unknown divergence
    ([*DISTILL, "algo.distill_topk=8"], "algo.distill_topk=8 is read only with"),  # top-k of the sampled estimate
    ([*DISTILL, "algo.distill_loss=reverse_kl", "algo.distill_beta=0.3"], "algo.distill_beta=0.3 is read only"),
    ([*DISTILL, "algo.distill_loss=jsd", "algo.distill_beta=1.0"], "algo.distill_beta must be in (0, 1)"),
    (["algo.distill_loss=reverse_kl"], "algo.distill_loss=reverse_kl is read only"),  # without distill
])
def test_combinations_that_make_no_sense_are_refused(overrides, says):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(PPOConfig, REPO / "recipes/grpo_arithmetic.yaml", [*TINY, *overrides])
    assert says in str(e.value), e.value


def test_pure_distillation_needs_no_reward_and_no_groups(tmp_path):
    cfg = config(tmp_path, "reward.functions={}", "rollout.n=1", "actor.mini_batch_size=4")
    assert cfg.roles == ["actor", "rollout", "teacher"]


@pytest.mark.parametrize("loss", ["advantage", "forward_kl"])
def test_resume_gives_identical_next_step(tmp_path, loss):
    full, part = tmp_path / "full", tmp_path / "part"
    train(config(full, "trainer.steps=3", "trainer.save_every=2", f"algo.distill_loss={loss}"))
    train(config(part, "trainer.steps=2", f"algo.distill_loss={loss}"))
    train(config(part, "trainer.steps=3", "trainer.resume=auto", f"algo.distill_loss={loss}"))
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/"))}
    a, b = [r for r in steps(full) if r["step"] == 3], [r for r in steps(part) if r["step"] == 3]
    assert drop(a[0]) == drop(b[0]) and "distill/reverse_kl" in a[0]


@pytest.mark.ray  # the session's Ray instance (tests/conftest.py)
def test_the_teacher_on_a_ray_worker_of_its_own(tmp_path):
    """The teacher on the pool 'aux' (its own Ray worker), the actor and rollout on 'main'
    (a Ray worker too): the same first step as the colocated local run, with GKD's loss (the
    teacher's [B, R, V] distributions cross the process boundary)."""
    ray_dir, local_dir = tmp_path / "ray", tmp_path / "local"
    train(config(ray_dir, "trainer.steps=1", "placement.backend=ray", "placement.threads_per_worker=1",
                 "placement.pools.aux=1", "placement.roles.teacher=aux", "algo.distill_loss=forward_kl"))
    train(config(local_dir, "trainer.steps=1", "algo.distill_loss=forward_kl"))
    a, b = steps(ray_dir)[0], steps(local_dir)[0]
    for key in ("distill/reverse_kl", "distill/teacher_logprob", "actor/loss", "actor/distill_loss"):
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
