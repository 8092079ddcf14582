"""Tinker code and `baton train` compute the same first step. An RL loop written against the
official SDK (sample a group per prompt from `baton tinker`, score it, group advantages, one
`forward_backward` + `optim_step`) hands its scored groups, unchanged, to the trajectory API,
and `baton train` of the shipped recipe (recipes/grpo_arithmetic_api.yaml, no `baton serve`: the
SDK's sampler is the server)
trains its first step on exactly those rows: the whole driver (ApiSource, the reward-less
path, the advantage estimator, the actor update). The SDK step's loss and gradient norm equal
the run's `actor/loss` and `actor/grad_norm` (metrics.jsonl) within fp32 tolerance.

Two equivalences: the recipe's own GRPO + PPO clip (0.2 / 0.28) with the SDK's `ppo` loss,
and tinker-cookbook rl_loop's estimator (reward - group mean: baton's `dr_grpo`) with
`importance_sampling` (baton's `vanilla`). Tinker's losses are sums over tokens, baton's
recipe averages over the batch's tokens (`token-mean`): the loop divides its advantages by
the token count, as a user porting the recipe would. Skipped without the SDK (`.[tinker]`)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from baton.cli import main  # noqa: E402
from baton.envs import ArithmeticTask, verify  # noqa: E402
from baton.metrics import read_metrics  # noqa: E402
from baton.rollout.server import ServerThread  # noqa: E402
from baton.services.api import build_api_app  # noqa: E402
from baton.tinker.app import build_app, load_service  # noqa: E402
from baton.tinker.trainee import LORA_ALPHA  # noqa: E402
from tests.tinker_api.conftest import KEY  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SFT = REPO / "checkpoints/arith-sft"  # the recipe's warm start: right some of the time
PROMPTS, N, MAX_TOKENS, RANK, LR = 8, 4, 4, 8, 1e-4
# (recipe overrides, SDK loss, its config, advantages normalised by the group's std)
CASES = {"grpo+ppo": ([], "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}, True),
         "rl_loop: dr_grpo+importance_sampling": (["algo.advantage=dr_grpo", "algo.policy_loss=vanilla"],
                                                  "importance_sampling", None, False)}


@pytest.fixture(scope="module")
def sft_server(tmp_path_factory):
    service = load_service(SFT, model_name="arith-sft", state_dir=tmp_path_factory.mktemp("state"))
    thread = ServerThread(build_app(service, api_key=KEY, poll_s=5.0))
    yield thread
    thread.stop()


def sdk_groups(url: str, seed: int) -> tuple[object, list[dict]]:
    """The loop's sampling half: a LoRA training client, its sampler, N samples per prompt,
    each scored 1 if it is the right answer. Groups in the trajectory API's shape."""
    service = tinker.ServiceClient(base_url=url, api_key=KEY)
    tc = service.create_lora_training_client(base_model="arith-sft", rank=RANK, seed=0, train_unembed=False).result()
    tok = tc.get_tokenizer()
    sampler = tc.save_weights_and_get_sampling_client().result()
    groups = []
    for row in ArithmeticTask().train_rows(PROMPTS, seed=seed):
        prompt = tok(row["prompt"])["input_ids"]
        out = sampler.sample(types.ModelInput.from_ints(prompt), N,
                             types.SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=seed)).result()
        seqs = out.sequences
        groups.append({"tokens": [prompt + list(s.tokens) for s in seqs],
                       "masks": [[-100] * len(prompt) + list(s.tokens) for s in seqs],
                       "inference_logprobs": [[0.0] * len(prompt) + list(s.logprobs) for s in seqs],
                       "scores": [1.0 if verify(tok.decode(s.tokens, skip_special_tokens=True), row["answer"]) else 0.0
                                  for s in seqs]})
    return tc, groups


def sdk_step(tc, groups: list[dict], loss_fn: str, config: dict | None,
             by_std: bool) -> tuple[float, float, int, float]:
    """The loop's training half: group advantages, datums (prompt positions weigh 0), one step.
    Also the token count and the mean |advantage| over the trained tokens."""
    n_tokens = sum(m != -100 for g in groups for mask in g["masks"] for m in mask)
    data, size = [], 0.0
    for g in groups:
        r = torch.tensor(g["scores"])
        adv = (r - r.mean()) / (r.std() + 1e-6) if by_std else r - r.mean()  # std: unbiased, as GRPO's
        for toks, mask, lps, a in zip(g["tokens"], g["masks"], g["inference_logprobs"], adv.tolist()):
            trained = [float(m != -100) for m in mask[1:]]
            size += abs(a) * sum(trained) / n_tokens
            data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={
                "target_tokens": np.array(toks[1:]), "logprobs": np.array(lps[1:], np.float32),
                "advantages": np.array([w * a / n_tokens for w in trained], np.float32)}))
    loss = tc.forward_backward(data, loss_fn, loss_fn_config=config).result().metrics["loss:sum"]
    norm = tc.optim_step(types.AdamParams(learning_rate=LR)).result().metrics["optim/grad_norm"]
    return loss, norm, n_tokens, size


def push(api_url: str, groups: list[dict], stop: threading.Event) -> None:
    """The groups to the trajectory API once the trainer has registered."""
    http = httpx.Client(base_url=api_url, timeout=30)
    while http.post("/register-env", json={"max_token_length": 64, "desired_name": "sdk", "weight": 1.0,
                                           "group_size": N}).json().get("status") != "success":
        if stop.wait(0.2):
            return
    for g in groups:
        assert http.post("/scored_data", json={**g, "env_id": 0}).status_code == 200


def baton_first_step(groups: list[dict], extra: list[str], run: Path) -> dict:
    api = ServerThread(build_api_app(str(run.parent / f"{run.name}.sqlite")))
    stop = threading.Event()
    env = threading.Thread(target=push, args=(api.url, groups, stop), daemon=True)
    env.start()
    try:
        assert main(["train", str(REPO / "recipes/grpo_arithmetic_api.yaml"), f"model.path={SFT}",
                     f"trainer.run_dir={run}", "trainer.steps=1", f"data.api_url={api.url}", "data.servers=[]",
                     "data.envs=[]",
                     f"data.prompts_per_step={PROMPTS}", f"rollout.n={N}", f"model.lora.rank={RANK}",
                     f"model.lora.alpha={LORA_ALPHA}", f"actor.lr={LR}", "actor.lr_warmup_steps=0",
                     f"actor.mini_batch_size={PROMPTS * N}", f"actor.micro_batch_size={PROMPTS * N}",
                     "actor.grad_clip=1e9", "data.eval_size=2", "trainer.eval_every=0", "trainer.progress=false", *extra]) == 0
    finally:
        stop.set()
        env.join(10)
        api.stop()
    return next(r for r in read_metrics(run) if r["step"] == 1)


@pytest.mark.parametrize("case", list(CASES))
def test_sdk_loop_and_baton_train_take_the_same_first_step(sft_server, tmp_path, case):
    extra, loss_fn, config, by_std = CASES[case]
    tc, groups = sdk_groups(sft_server.url, seed=1)
    rewards = [s for g in groups for s in g["scores"]]
    assert 0 < sum(rewards) < len(rewards)  # some groups carry a signal
    want = baton_first_step(groups, extra, tmp_path / "run")
    loss, norm, n_tokens, size = sdk_step(tc, groups, loss_fn, config, by_std)
    # fp32 tolerance: each side sums n_tokens per-token terms ratio * A / n_tokens (ratios ~1)
    # in its own order (baton pads the batch into one forward pass, the server runs each datum
    # alone), and the logprobs themselves differ by a few ulps; a sum's rounding error is at
    # most ~n_tokens * eps32 times the sum of its terms' sizes (`size`: mean |A|), not times
    # the loss, which nearly cancels (advantages sum to 0 in each group). The gradient norm
    # does not cancel: relative n_tokens * eps32. Measured: 2e-8 and 1e-6 relative.
    eps = float(torch.finfo(torch.float32).eps)
    assert loss == pytest.approx(want["actor/loss"], rel=0, abs=n_tokens * eps * size)
    assert norm == pytest.approx(want["actor/grad_norm"], rel=n_tokens * eps)
    assert want["reward/mean"] == pytest.approx(sum(rewards) / len(rewards))
