"""The official `tinker` SDK, unchanged, against `baton tinker` on loopback (skipped without the
SDK: `pip install -e ".[tinker]"`; CI's tinker job runs them): a LoRA training client trains
and a sampling client samples from the new weights; the losses are baton's own numbers; an
unsupported call and a malformed request raise the SDK's exceptions with the server's reason."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tests.tinker_api.conftest import KEY, NAME, base_logprobs, golden_rows  # noqa: E402


@pytest.fixture(scope="module")
def service(server):
    client = tinker.ServiceClient(base_url=server.url, api_key=KEY)
    yield client
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client.close("success")


def row(tokens, **inputs):
    return types.Datum(model_input=types.ModelInput.from_ints(tokens), loss_fn_inputs=inputs)


def test_lora_trains_and_samples_from_new_weights(service, tiny_dir):
    tc = service.create_lora_training_client(base_model=NAME, rank=8, seed=0).result()
    assert tc.get_info().lora_rank == 8 and tc.get_tokenizer().encode("1+1=2")
    seq = [10, 20, 30, 40, 50, 60, 70, 80]
    datum = row(seq[:-1], target_tokens=np.array(seq[1:]), weights=np.ones(7, np.float32))
    losses = []
    for _ in range(5):
        fb = tc.forward_backward([datum, datum], "cross_entropy")
        step = tc.optim_step(types.AdamParams(learning_rate=3e-3))
        losses.append(fb.result().metrics["loss:sum"])
        assert step.result().metrics["optim/grad_norm"] > 0
    assert all(b < a for a, b in zip(losses, losses[1:])) and losses[-1] < 0.8 * losses[0], losses
    sampler = tc.save_weights_and_get_sampling_client().result()
    out = sampler.sample(types.ModelInput.from_ints(seq[:3]), 3, types.SamplingParams(max_tokens=5, seed=1)).result()
    assert len(out.sequences) == 3 and all(len(s.tokens) == len(s.logprobs) == 5 for s in out.sequences)
    trained = sampler.compute_logprobs(types.ModelInput.from_ints(seq)).result()
    base = base_logprobs(tiny_dir, seq[:-1], seq[1:])
    assert trained[0] is None and sum(trained[1:]) > float(base.sum()) + 5  # the new weights, not the base's
    # the sampled tokens' logprobs are the trained model's: score one sequence through forward
    s = out.sequences[0]
    full = seq[:3] + s.tokens
    fwd = tc.forward([row(full[:-1], target_tokens=np.array(full[1:]), weights=np.ones(len(full) - 1, np.float32))],
                     "cross_entropy").result()
    np.testing.assert_allclose(fwd.loss_fn_outputs[0]["logprobs"].tolist()[2:], s.logprobs, atol=1e-4)
    # a named checkpoint reopens as a sampler; a saved state loads back
    path = tc.save_weights_for_sampler("named").result().path
    again = service.create_sampling_client(model_path=path)
    assert again.compute_logprobs(types.ModelInput.from_ints(seq)).result()[1:] == pytest.approx(trained[1:], abs=1e-5)
    state = tc.save_state("st").result().path
    fresh = service.create_training_client_from_state_with_optimizer(state).result()
    reloaded = fresh.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    now = tc.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    assert reloaded == pytest.approx(now, rel=1e-5)


def test_sdk_losses_equal_baton_policy_losses(service, tiny_dir):
    """The SDK's protobuf path gives the numbers baton's ppo_clip / vanilla losses give."""
    rows, expect = golden_rows(tiny_dir)
    tc = service.create_lora_training_client(base_model=NAME, rank=4, seed=0).result()
    data = [row(t, target_tokens=np.array(tg), logprobs=old, advantages=adv) for t, tg, old, adv in rows]
    for loss_fn, value in expect.items():
        got = tc.forward(data, loss_fn).result()
        assert got.metrics["loss:sum"] == pytest.approx(value, rel=1e-5, abs=1e-5)
    ce = tc.forward([row(t, target_tokens=np.array(tg), weights=np.ones(len(t), np.float32)) for t, tg, _, _ in rows],
                    "cross_entropy").result()
    want = -sum(float(base_logprobs(tiny_dir, t, tg).sum()) for t, tg, _, _ in rows)
    assert ce.metrics["loss:sum"] == pytest.approx(want, rel=1e-5)
    assert isinstance(ce.loss_fn_outputs[0]["logprobs"].to_torch(), torch.Tensor)


def test_sdk_errors_name_the_problem(service):
    tc = service.create_lora_training_client(base_model=NAME, rank=4).result()
    d = row([5, 6, 7], target_tokens=np.array([6, 7, 8]), logprobs=np.zeros(3, np.float32),
            advantages=np.ones(3, np.float32))
    with pytest.raises(tinker.BadRequestError, match="loss_fn 'cispo' is not served"):
        tc.forward_backward([d], "cispo").result()
    bad = row([5, 6, 7], target_tokens=np.array([6, 7]), weights=np.ones(2, np.float32))
    with pytest.raises(tinker.BadRequestError, match=r"needs \[3\]"):
        service.create_lora_training_client(base_model=NAME, rank=4).result().forward([bad], "cross_entropy").result()
    with pytest.raises(tinker.NotFoundError, match="is not served here"):
        service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()


def test_sdk_error_shapes_for_a_wrong_key_and_a_failed_call(server, service):
    """A 401 is the SDK's AuthenticationError with the server's reason; a call accepted and
    then failed on what it asked (a checkpoint that is not there) is its RequestFailedError,
    in the user category (not retried)."""
    with pytest.raises(tinker.AuthenticationError, match="invalid API key"):
        tinker.ServiceClient(base_url=server.url, api_key="tml-wrong").create_lora_training_client(NAME, rank=4)
    tc = service.create_lora_training_client(base_model=NAME, rank=4).result()
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint at") as failed:
        tc.load_state(f"tinker://{tc.model_id}/weights/missing").result()
    assert failed.value.category == tinker.types.RequestErrorCategory.User
