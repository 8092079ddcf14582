"""The trainer-side weight-sync protocol and a logprob-parity check.

A `WeightSync` moves the trainer's current weights into the rollout engine(s) and tags
them with a policy version:

    sync.push(model.named_parameters(), version)

Transports: `InplaceSync` (colocated, nothing to copy), `CheckpointSync` (safetensors file,
then a reload: in process or via `/update_weights_from_disk`), `BroadcastSync`
(torch.distributed broadcast into servers that joined via `/init_weights_update_group`);
chosen by name through `baton.sync.registry`.

`check_logprob_parity` is the runtime check that a sync worked: the engine's logprobs for
a sequence must equal the trainer's (up to numerics).
"""

from __future__ import annotations

from typing import Iterable, Protocol, Sequence, runtime_checkable

import torch

from baton.protocol import SamplingParams


@runtime_checkable
class WeightSync(Protocol):
    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Make the engines serve these weights, tagged `version`; returns when they do."""
        ...

    def close(self) -> None: ...


@torch.no_grad()
def check_logprob_parity(engine, model: torch.nn.Module, token_ids: Sequence[int], max_new_tokens: int = 8,
                         lora: str | None = None) -> float:
    """Max |engine logprob - trainer logprob| over `max_new_tokens` greedy tokens after `token_ids`.

    The engine continues the prompt greedily (temperature 0 -> logprobs at temperature 1,
    see the protocol); the trainer scores the same tokens with one full forward pass. The
    tokens come from the engine, so the comparison is meaningful even if argmaxes differ.
    `lora`: the engine samples with that adapter (`model`: the peft model holding it).
    """
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=True, lora=lora)
    comp = engine.generate([list(token_ids)], params)[0]
    device = next(model.parameters()).device
    seq = torch.tensor([list(token_ids) + comp.token_ids], device=device)  # [1, P + R]
    was_training = model.training
    model.eval()
    logits = model(input_ids=seq).logits.float()  # [1, P + R, V]
    model.train(was_training)
    p, r = len(token_ids), len(comp.token_ids)
    logp = torch.log_softmax(logits[0, p - 1 : p - 1 + r], dim=-1)  # [R, V]: position t predicts token t+1
    trainer = logp.gather(-1, seq[0, p:, None]).squeeze(-1)  # [R]
    engine_lp = torch.tensor(comp.logprobs, dtype=torch.float32, device=device)  # [R]
    return float((trainer - engine_lp).abs().max())
