"""One driver for the PPO family: combinations the two drivers it replaced could not express,
each run for real on a tiny model and checked for doing what its keys say.

    GRPO + DAPO dynamic sampling      (the GRPO driver ignored algo.dynamic_sampling)
    REINFORCE++ with gamma < 1        (the GRPO driver ran it with gamma 1 whatever algo.gamma said)
    PPO with a critic + one_step_off  (the PPO driver ignored trainer.mode)
    PPO with a critic from the API    (the PPO driver ignored data.source=api)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from baton import fields as F
from baton.config import ConfigError, load_config
from baton.metrics import read_metrics
from baton.models.load import load_tokenizer
from baton.models.make import make_tiny_checkpoint
from baton.rollout.server import ServerThread
from baton.services.api import build_api_app
from baton.trainers import ppo
from baton.trainers.ppo_config import PPOConfig

REPO = Path(__file__).resolve().parents[2]
TINY = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
        "actor.micro_batch_size=8", "actor.mini_batch_size=8", "actor.lr=1e-3", "trainer.progress=false"]
CRITIC = ["critic.micro_batch_size=8", "critic.mini_batch_size=8", "critic.lr=1e-4", "critic.pretrain_steps=0"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def config(recipe: str, model_dir: str, run_dir: Path, *extra: str) -> PPOConfig:
    return load_config(PPOConfig, REPO / "recipes" / recipe,
                       [f"model.path={model_dir}", f"trainer.run_dir={run_dir}", *TINY, *extra])


def steps_of(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir) if r["step"] > 0]


def test_grpo_with_dynamic_sampling_keeps_groups_with_a_signal(model_dir, tmp_path):
    ppo.train(config("grpo_arithmetic.yaml", model_dir, tmp_path, "trainer.steps=2", "algo.dynamic_sampling=true",
                     "algo.dynamic_sampling_max_rounds=2"))
    for s in steps_of(tmp_path):
        assert s["dapo/groups_drawn"] >= 4 and s["dapo/groups_kept"] + s["dapo/groups_filled"] == 4
        assert s["dapo/extra_rounds"] <= 2
        assert s["dapo/groups_drawn"] == 4 * (1 + s["dapo/extra_rounds"])


def test_reinforce_pp_uses_gamma(model_dir, tmp_path, monkeypatch):
    """REINFORCE++ returns are discounted by algo.gamma: the driver hands the estimator the
    recipe's gamma, and the advantages (same rows, same seed) change with it."""
    seen: list[tuple[float, torch.Tensor]] = []
    real = ppo.compute_advantages

    def spy(name, **kwargs):
        out = real(name, **kwargs)
        seen.append((kwargs.get("gamma"), out[0].clone()))
        return out

    monkeypatch.setattr(ppo, "compute_advantages", spy)
    sft = str(REPO / "checkpoints/arith-sft")  # right some of the time: rewards that differ
    for gamma in (1.0, 0.5):
        ppo.train(config("grpo_arithmetic.yaml", sft, tmp_path / str(gamma), "trainer.steps=1",
                         "algo.advantage=reinforce_pp", f"algo.gamma={gamma}", "data.prompts_per_step=8"))
    (g1, a1), (g2, a2) = seen
    assert (g1, g2) == (1.0, 0.5)
    assert a1.shape == a2.shape and a1.abs().sum() > 0 and not torch.allclose(a1, a2)


@pytest.mark.ray
def test_ppo_with_a_critic_generates_one_step_off(model_dir, tmp_path):
    ppo.train(config("ppo_arithmetic.yaml", model_dir, tmp_path, *CRITIC, "trainer.steps=3",
                     "trainer.mode=one_step_off", "trainer.check_weight_sync=true"))
    s1, s2, s3 = steps_of(tmp_path)
    assert all("critic/vf_loss" in s and "critic/explained_var" in s for s in (s1, s2, s3))
    assert s1["rollout/policy_age"] == 0 and s2["rollout/policy_age"] == 1 and s3["rollout/policy_age"] == 1


def _push_groups(api_url: str, tok, stop: threading.Event) -> None:
    """An environment that posts groups of 4 made-up answers (scored 1 for the right sum)."""
    import httpx

    from baton.envs import ArithmeticTask, verify

    rows = ArithmeticTask().train_rows(32, seed=1)
    http = httpx.Client(base_url=api_url, timeout=10)
    while http.post("/register-env", json={"max_token_length": 64, "desired_name": "t", "weight": 1.0,
                                           "group_size": 4}).json().get("status") != "success":
        if stop.wait(0.2):
            return
    i = 0
    while not stop.is_set():
        row = rows[i % len(rows)]
        ids = tok(row["prompt"])["input_ids"]
        toks, masks, scores = [], [], []
        for k in range(4):
            resp = tok(str(i + k))["input_ids"] + [tok.eos_token_id]
            toks.append(ids + resp)
            masks.append([-100] * len(ids) + resp)
            scores.append(1.0 if verify(str(i + k), row["answer"]) else 0.0)
        http.post("/scored_data", json={"tokens": toks, "masks": masks, "scores": scores, "env_id": 0})
        i += 1
        stop.wait(0.01)


def test_ppo_with_a_critic_trains_from_the_api(model_dir, tmp_path):
    server = ServerThread(build_api_app(str(tmp_path / "api.sqlite")))
    stop = threading.Event()
    env = threading.Thread(target=_push_groups, args=(server.url, load_tokenizer(model_dir), stop), daemon=True)
    env.start()
    try:
        ppo.train(config("ppo_arithmetic.yaml", model_dir, tmp_path / "run", *CRITIC, "trainer.steps=2",
                         "data.source=api", f"data.api_url={server.url}", "trainer.max_staleness=1"))
    finally:
        stop.set()
        env.join(10)
        server.stop()
    s1, s2 = steps_of(tmp_path / "run")
    assert "critic/vf_loss" in s1 and "actor/grad_norm" in s2
    assert s1["reward/mean"] >= 0 and "dapo/groups_drawn" not in s1


def test_combinations_that_cannot_run_are_refused_by_name(model_dir, tmp_path):
    def error(*extra):
        with pytest.raises(ConfigError) as e:
            config("grpo_arithmetic.yaml", model_dir, tmp_path, *extra)
        return str(e.value)

    assert "algo.dynamic_sampling" in error("algo.dynamic_sampling=true", "trainer.mode=one_step_off")
    assert "greedy response" in error("algo.advantage=remax", "data.source=api")
    assert "trainer.max_staleness" in error("trainer.max_staleness=2")  # sync, no API: nothing it bounds
    assert "use trainer.mode=sync" in error("data.source=api", "trainer.mode=async")
    assert "unknown config key" in error("algo.tis_cap=2")  # one off-policy mechanism: algo.off_policy
    # estimators' declared needs: a group estimator with one sample a prompt, a key no estimator reads
    assert "rollout.n=1" in error("algo.advantage=turn_grpo", "rollout.n=1", "actor.mini_batch_size=0")
    assert "rollout.temperature=0" in error("algo.advantage=turn_grpo", "rollout.temperature=0")
    assert "algo.lam=0.9" in error("algo.advantage=reinforce_pp", "algo.lam=0.9")
    assert "needs values from a critic" in error("algo.advantage=gae")
    # the row source's declared capabilities (baton.sources.SOURCES)
    assert "rollout.top_k" in error("data.source=api", "rollout.top_k=5")
    assert "give both or neither" in error("data.source=agent")
    # sections and keys only some sources read (SourceSpec.reads): set under another, refused
    assert "`agent:` section" in error("agent.env=calculator")  # data.source=rollout
    assert "data.servers is read only with data.source=api" in error('data.servers=["http://127.0.0.1:9"]')
    assert "reward.timeout_s" in error("data.source=api", "reward.timeout_s=3")  # rows arrive scored
    cfg = config("grpo_arithmetic.yaml", model_dir, tmp_path)
    assert cfg.algorithm == "grpo" and cfg.algo.advantage == "grpo"
    assert config("ppo_arithmetic.yaml", model_dir, tmp_path, *CRITIC, "algo.advantage=").algo.advantage == "gae"
    assert F.GROUP_INDEX == "group_index"


def test_an_environment_whose_group_size_differs_is_refused_at_start(tmp_path):
    """`baton launch` would start an environment pushing groups of 4 to a trainer comparing
    groups of 8 (the batch never fills): one line naming both, before anything is written."""
    with pytest.raises(ConfigError, match="sets --group-size 4, but the trainer compares groups of rollout.n=8"):
        load_config(PPOConfig, REPO / "recipes/grpo_arithmetic_api.yaml",
                    [f"trainer.run_dir={tmp_path / 'never'}", 'data.envs=["arithmetic --group-size 4"]'])
    assert not (tmp_path / "never").exists()
