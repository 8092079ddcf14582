"""Direction of one real preference step: online DPO (generate -> score -> pair ->
reference -> update, baton/trainers/online_dpo.py), offline DPO from a file of pairs
(baton/trainers/offline_dpo.py) and the Bradley-Terry reward model
(baton/trainers/reward_model.py), each on a tiny model.

Hand-worked (DPO, Rafailov et al. 2023): with h = [log pi(c) - log ref(c)] - [log pi(r) -
log ref(r)], the loss is -log sigmoid(beta h), whose gradient is -beta sigmoid(-beta h) dh.
At the first step pi = ref, so h = 0 and every pair weighs sigmoid(0) = 1/2: the update
ascends sum_pairs h = sum [log pi(c) - log pi(r)] + const. Adam's first step raises that sum
to first order (lr * sum_k |d/dθ_k|, as in tests/direction/test_ppo_family.py): the chosen
rows' logprobs rise relative to the rejected ones'. The pair's chosen row is the one with
the higher reward (online) or the file's `chosen` text (offline); a swapped pair, a flipped
loss sign or a dropped reference term (h's ref part is a constant at step 1 but its
presence is checked by the loss's own tests) moves the margin the other way.
Bradley-Terry: loss -log sigmoid(r_c - r_r): one Adam step raises sum_pairs (r_c - r_r).
"""

from __future__ import annotations

import json
import random

import pytest
import torch

from baton import fields as F
from baton.config import load_config
from baton.envs import get_task
from baton.models.make import make_tiny_checkpoint
from baton.trainers import offline_dpo, online_dpo
from baton.trainers import reward_model as rm
from baton.trainers.dpo_config import DPOConfig, OfflineDPOConfig
from baton.workers.dpo_actor import PAIR_PAD

from .harness import REPO, observe

ONLINE = ["data.prompts_per_step=4", "data.eval_size=4", "rollout.n=4", "rollout.max_new_tokens=4",
          "actor.micro_batch_size=32", "actor.mini_batch_size=0", "actor.lr=1e-3", "actor.lr_warmup_steps=0",
          "trainer.progress=false", "trainer.eval_every=0", "trainer.steps=1", "dpo.nll_coef=0.0",
          "reward.functions={direction/parity: 1.0}"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_checkpoint(tmp_path_factory.mktemp("m") / "tiny", preset="0.75m", seed=0))


def chosen_rose(update) -> torch.Tensor:
    """sum over real pairs of d[log pi(c) - log pi(r)] > 0, and the mean chosen change above the
    mean rejected change. Returns the pair-major rows' real-pair mask [P]."""
    real = ~update.batch[PAIR_PAD][0::2]  # [P]
    d = update.delta  # [2P] pair-major: c0, r0, c1, r1, ...
    dc, dr = d[0::2][real], d[1::2][real]
    assert len(dc) >= 1
    assert float((dc - dr).sum()) > 0, (dc, dr)
    assert dc.mean() > dr.mean()
    return real


def test_online_dpo_raises_the_higher_rewarded_completion(model_dir, tmp_path, monkeypatch):
    seen = observe(monkeypatch)
    cfg = load_config(DPOConfig, REPO / "recipes" / "online_dpo_arithmetic.yaml",
                      [f"model.path={model_dir}", f"trainer.run_dir={tmp_path}", *ONLINE, "dpo.pairing=best_worst"])
    online_dpo.train(cfg)
    (u,) = seen.actor
    real = chosen_rose(u)
    r = u.batch[F.REWARDS]
    assert (r[0::2][real] > r[1::2][real]).all(), r  # the pair's chosen row is the better-scored one


def test_offline_dpo_raises_the_files_chosen_text(model_dir, tmp_path, monkeypatch):
    rng = random.Random(0)
    rows = get_task("arithmetic").train_rows(8, seed=0)
    pairs = [{"prompt": r["prompt"], "chosen": r["answer"],
              "rejected": str(int(r["answer"]) + rng.choice([-3, -2, -1, 1, 2, 3]))} for r in rows]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    seen = observe(monkeypatch)
    cfg = load_config(OfflineDPOConfig, REPO / "recipes" / "offline_dpo_arithmetic.yaml",
                      [f"model.path={model_dir}", f"trainer.run_dir={tmp_path / 'run'}", f"data.path={path}",
                       "data.pairs_per_step=8", "data.task=", "actor.micro_batch_size=16", "actor.lr=1e-3",
                       "actor.lr_warmup_steps=0", "trainer.progress=false", "trainer.eval_every=0", "trainer.steps=1"])
    offline_dpo.train(cfg)
    (u,) = seen.actor
    real = chosen_rose(u)
    # the chosen rows are the file's chosen texts: decode the response ids back
    from baton.models.load import load_tokenizer

    tok = load_tokenizer(model_dir)
    mask = u.batch[F.RESPONSE_MASK].bool()
    texts = [tok.decode(ids[m], skip_special_tokens=True).strip() for ids, m in zip(u.batch[F.RESPONSE_IDS], mask)]
    for i in torch.nonzero(real).flatten().tolist():
        b = u.batch
        prompt = tok.decode(b[F.PROMPT_IDS][2 * i][b[F.PROMPT_MASK][2 * i].bool()], skip_special_tokens=True)
        p = max((p for p in pairs if p["prompt"] in prompt), key=lambda p: len(p["prompt"]))  # its pair
        assert (texts[2 * i], texts[2 * i + 1]) == (p["chosen"], p["rejected"]), (texts[2 * i:2 * i + 2], p)


def text_scores(model, tokenizer, pairs, side: str, max_length: int) -> torch.Tensor:
    """[N] the model's score of each pair's `side` text alone, read the way the reward-model
    role reads a completion (baton.workers.reward_model: encode_pair, sequence_scores), not
    through the trainer's pair_scores."""
    from baton.workers.reward_model import encode_pair, pad_right, sequence_scores

    ids, mask = pad_right([encode_pair(tokenizer, p["prompt"], p[side], max_length) for p in pairs],
                          tokenizer.pad_token_id)
    was = model.training
    model.eval()
    with torch.no_grad():
        out = sequence_scores(model, ids, mask).double()
    model.train(was)
    return out


def test_reward_model_step_widens_the_chosen_margin(model_dir, tmp_path, monkeypatch):
    """One Bradley-Terry step on the task's pairs (chosen = the right answer): the margin
    r(chosen) - r(rejected) of the step's pairs rises, each side scored on its own."""
    calls = []
    real = rm.pair_scores

    def pair_scores(model, tokenizer, pairs, max_length):
        if model.training and not calls:  # the first training step, before its forward
            calls.append((model, tokenizer, pairs, max_length,
                          text_scores(model, tokenizer, pairs, "chosen", max_length)
                          - text_scores(model, tokenizer, pairs, "rejected", max_length)))
        return real(model, tokenizer, pairs, max_length)

    monkeypatch.setattr(rm, "pair_scores", pair_scores)
    cfg = load_config(rm.RMConfig, REPO / "recipes" / "rm_arithmetic.yaml",
                      [f"model.path={model_dir}", "data.num_pairs=40", "data.eval_fraction=0", "trainer.steps=1",
                       "trainer.batch_size=16", "optim.lr=1e-3", "optim.lr_warmup_steps=0",
                       f"trainer.run_dir={tmp_path}", "trainer.progress=false"])
    rm.run_rm(cfg)
    model, tokenizer, pairs, max_length, before = calls[0]
    answers = {r["prompt"]: r["answer"] for r in get_task("arithmetic").train_rows(40, seed=0)}
    assert all(p["chosen"] == answers[p["prompt"]] != p["rejected"] for p in pairs)  # chosen: the right answer
    after = (text_scores(model, tokenizer, pairs, "chosen", max_length)
             - text_scores(model, tokenizer, pairs, "rejected", max_length))
    assert float((after - before).sum()) > 0, (before, after)
