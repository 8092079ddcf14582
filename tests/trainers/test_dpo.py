"""Whole DPO runs on a tiny random model: online on local (pairs, metrics, a step without
pairs), exact resume (with a reference refresh in between), Ray with the reference on its
own pool, config errors before anything loads, and offline DPO from a jsonl of pairs."""

import json
import random
import sys
from pathlib import Path

import pytest

from baton.cli import main
from baton.config import ConfigError, load_config
from baton.envs import get_task
from baton.metrics import read_metrics
from baton.models.make import make_tiny_checkpoint
from baton.trainers.dpo_config import DPOConfig, OfflineDPOConfig
from baton.trainers.online_dpo import train

if str(Path(__file__).parent) not in sys.path:  # dpo_text_reward by name (--import-mode=importlib)
    sys.path.insert(0, str(Path(__file__).parent))

RECIPE = "recipes/online_dpo_arithmetic.yaml"
TINY = ["data.prompts_per_step=4", "data.eval_size=8", "rollout.n=4", "rollout.max_new_tokens=6",
        "actor.micro_batch_size=8", "actor.mini_batch_size=0", "actor.lr=1e-3", "trainer.progress=false",
        "trainer.eval_every=0"]
# A random tiny model never answers arithmetic right, so every score ties and no pair is
# made; this reward spreads the scores of its samples instead (same text, same score).
VARIED = "reward.functions={dpo_text_reward:text_hash: 1.0}"
PAIR_METRICS = ("dpo/pairs", "dpo/unpaired_prompts", "dpo/score_margin", "rewards/chosen", "rewards/rejected",
                "rewards/margins", "rewards/accuracies", "logps/chosen", "logps/rejected", "dpo/kl",
                "actor/loss", "actor/grad_norm", "timing/reference_s", "timing/update_s")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def run(model_dir, run_dir, *extra):
    cfg = load_config(DPOConfig, RECIPE, [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY, *extra])
    return train(cfg)


def steps_of(run_dir):
    return [r for r in read_metrics(run_dir) if r["step"] > 0]


def test_two_steps_local_log_pairs_and_preference_metrics(model_dir, tmp_path):
    result = run(model_dir, tmp_path, "trainer.steps=2", VARIED, "dpo.pairing=all")
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    for key in PAIR_METRICS:
        assert key in steps[0], key
    first = steps[0]
    assert first["dpo/pairs"] > 4 and first["dpo/skipped_update"] == 0  # all: several pairs per prompt
    assert first["dpo/score_margin"] > 0 and first["rollout/policy_age"] == 0
    # the first step is taken at the reference itself: every log-ratio is 0
    assert first["rewards/margins"] == pytest.approx(0, abs=1e-5) and first["dpo/kl"] == pytest.approx(0, abs=1e-5)
    assert "eval/accuracy_greedy" in result and "start/eval/accuracy_greedy" in result
    assert (tmp_path / "checkpoints" / "step_2" / "config.json").exists()
    assert (tmp_path / "report.png").stat().st_size > 0


def test_a_step_without_pairs_says_so_and_goes_on(model_dir, tmp_path):
    # arithmetic/correct on a random model: every sample scores 0, every prompt ties
    run(model_dir, tmp_path, "trainer.steps=2")
    for step in steps_of(tmp_path):
        assert step["dpo/pairs"] == 0 and step["dpo/unpaired_prompts"] == 4
        assert step["dpo/skipped_update"] == 1 and "actor/loss" not in step and "dpo/score_margin" not in step
    # and samples.jsonl shows why: the step's completions, each scored 0 (as in the PPO family)
    lines = [json.loads(ln) for ln in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert {r["step"] for r in lines} == {1, 2} and all(r["reward"] == 0 and "completion" in r for r in lines)


def test_resume_gives_identical_next_step(model_dir, tmp_path):
    """The 3rd step of a resumed run equals the uninterrupted run's; the reference is
    refreshed at step 2, so the resumed run must restore the refreshed reference too."""
    full, part = tmp_path / "full", tmp_path / "part"
    common = (VARIED, "dpo.ref_refresh_every=2")
    run(model_dir, full, "trainer.steps=3", "trainer.save_every=2", *common)
    run(model_dir, part, "trainer.steps=2", *common)
    run(model_dir, part, "trainer.steps=3", "trainer.resume=auto", *common)
    a = [r for r in read_metrics(full) if r["step"] == 3]
    b = [r for r in read_metrics(part) if r["step"] == 3]
    drop = lambda r: {k: v for k, v in r.items() if not k.startswith(("timing/", "throughput/"))}
    assert drop(a[0]) == drop(b[0])
    assert [r["dpo/ref_refreshed"] for r in steps_of(full)] == [0, 1, 0]
    # right after a refresh the reference is the policy: zero log-ratios again at step 3
    assert a[0]["dpo/kl"] == pytest.approx(0, abs=1e-5)


@pytest.mark.ray
@pytest.mark.slow  # ~17 s (Ray actors); split pools in the default run: tests/trainers/test_ppo_e2e.py
def test_ray_with_the_reference_on_its_own_pool(model_dir, tmp_path):
    # the reward is a registered name a Ray worker can import: use the shipped warm start,
    # whose samples are right often enough to make pairs with arithmetic/correct
    run("checkpoints/arith-sft", tmp_path, "trainer.steps=2", "placement.backend=ray",
        "placement.world_size=2", "placement.threads_per_worker=1", "placement.pools.aux=1",
        "placement.roles.reference=aux", "rollout.max_new_tokens=4", "data.prompts_per_step=6")
    steps = steps_of(tmp_path)
    assert [r["step"] for r in steps] == [1, 2]
    assert all(s["dpo/pairs"] > 0 and "rewards/accuracies" in s for s in steps)


def test_bad_names_exit_2_before_anything_loads(tmp_path, capsys):
    for override, message in (("dpo.loss=sigmoidd", "dpo.loss"), ("dpo.pairing=best", "dpo.pairing"),
                              ("dpo.label_smoothing=0.1 dpo.loss=ipo", "label_smoothing"),
                              ("actor.micro_batch_size=7", "even"), ("rollout.n=1", "rollout.n"),
                              ("dpo.reference_free=true placement.roles.reference=main", "unknown role")):
        code = main(["online-dpo", RECIPE, f"trainer.run_dir={tmp_path / 'never'}", *override.split()])
        assert code == 2 and message in capsys.readouterr().err, override
    assert not (tmp_path / "never").exists()
    with pytest.raises(ConfigError, match="data.path"):
        load_config(OfflineDPOConfig, None, ["data.path=/nonexistent.jsonl"])


def write_pairs(path, n, seed):
    """Arithmetic pairs: chosen = the right answer, rejected = a wrong one."""
    rng = random.Random(seed)
    rows = get_task("arithmetic").train_rows(n, seed=seed)
    with open(path, "w") as f:
        for r in rows:
            wrong = str(int(r["answer"]) + rng.choice([-3, -2, -1, 1, 2, 3]))
            f.write(json.dumps({"prompt": r["prompt"], "chosen": r["answer"], "rejected": wrong}) + "\n")


def test_offline_dpo_from_pairs_raises_preference_accuracy(model_dir, tmp_path):
    """`baton dpo` on 32 arithmetic pairs (6 passes): the preference accuracy and margin on
    those pairs, measured without a step at each evaluation, rise from 0."""
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs, 32, seed=0)
    code = main(["dpo", "recipes/offline_dpo_arithmetic.yaml", f"model.path={model_dir}", f"data.path={pairs}",
                 f"data.eval_path={pairs}", f"trainer.run_dir={tmp_path / 'run'}", "data.task=", "trainer.steps=12",
                 "trainer.eval_every=6", "data.pairs_per_step=16", "actor.micro_batch_size=32", "actor.lr=3e-3",
                 "trainer.progress=false"])
    assert code == 0
    rows = read_metrics(tmp_path / "run")
    evals = [r for r in rows if "eval/rewards/accuracies" in r]
    assert [r["step"] for r in evals] == [0, 6, 12]
    start, end = evals[0], evals[-1]
    assert start["eval/rewards/margins"] == pytest.approx(0, abs=1e-6)  # the policy is the reference
    assert end["eval/rewards/accuracies"] > 0.9 and end["eval/rewards/margins"] > 0.1, end
    assert end["eval/loss"] < start["eval/loss"]
    train_steps = [r for r in rows if "rewards/accuracies" in r]
    assert train_steps[-1]["rewards/margins"] > train_steps[0]["rewards/margins"]
    assert (tmp_path / "run" / "checkpoints" / "step_12" / "model.safetensors").exists()


def test_non_finite_training_stops_naming_the_step(tmp_path):
    """A beta that overflows float32 (1e39 = inf) makes every pair's loss non-finite: the
    actor skips those optimizer steps, and the K-th such step stops the run with an error
    naming it, after that step's metrics line (the weights stay the warm start's)."""
    from baton.trainers.session.run import NonFiniteError

    sft = str(Path(__file__).resolve().parents[2] / "checkpoints/arith-sft")
    with pytest.raises(NonFiniteError, match=r"step \d+: non-finite"):
        run(sft, tmp_path, "dpo.beta=1e39", "trainer.steps=30", "trainer.max_nonfinite_steps=2",
            "data.prompts_per_step=16")
    rows = [r for r in read_metrics(tmp_path) if r["step"] > 0]
    assert len(rows) < 30 and rows[-1]["trainer/nonfinite_steps"] == 2


def test_offline_dpo_stops_on_non_finite_training_naming_the_step(model_dir, tmp_path, capsys):
    """(Also: pairs with chosen == rejected are left out and counted in data/identical_pairs.)"""
    pairs = tmp_path / "pairs.jsonl"
    write_pairs(pairs, 32, seed=0)
    with open(pairs, "a") as f:  # two pairs that teach nothing
        f.write(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "2"}) + "\n" * 2)
        f.write(json.dumps({"prompt": "2+2=", "chosen": "4", "rejected": "4"}) + "\n")
    code = main(["dpo", "recipes/offline_dpo_arithmetic.yaml", f"model.path={model_dir}", f"data.path={pairs}",
                 f"trainer.run_dir={tmp_path / 'run'}", "data.task=", "trainer.steps=12", "trainer.eval_every=0",
                 "data.pairs_per_step=16", "actor.micro_batch_size=32", "dpo.beta=1e39",
                 "trainer.max_nonfinite_steps=2", "trainer.progress=false"])
    assert code != 0 and "step 2: non-finite" in capsys.readouterr().err
    rows = [r for r in read_metrics(tmp_path / "run") if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["trainer/nonfinite_steps"] == 2
    assert rows[-1]["data/identical_pairs"] == 2
