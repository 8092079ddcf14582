"""The actor role for preference optimisation (online and offline DPO): a DPO step.

Consumes pair batches laid out pair-major (`pair_rows`): row 2i is pair i's chosen
response, row 2i+1 its rejected one, with prompt/response ids and masks, `ref_logprobs`
[B, R] (unless `dpo.reference_free`) and `pair_pad` [B] (rows of padding pairs, which carry
no loss). Produces metrics (TRL's names: rewards/chosen, rewards/rejected, rewards/margins,
rewards/accuracies, logps/chosen, logps/rejected; and dpo/kl, plus dpo/nll with RPO's
`dpo.nll_coef`) and takes optimizer steps.

Why pair-major: dispatch splits a Batch into contiguous, equal chunks per data-parallel
rank, so a pair's two rows stay on one rank as long as every rank gets a whole number of
pairs; `pair_rows` pads with flagged copies of pair 0 to a multiple of the dp size, and
`update_dpo` refuses a chunk that dispatch had to pad (that would split a pair). Inside a
rank, mini- and micro-batches are cut on pair boundaries and shuffled by whole pairs, and
each mini-batch's loss is divided by its global number of real pairs (all-reduced), so
1 rank x 8 pairs and 2 ranks x 4 give the same gradient (tests/workers/test_dpo_actor.py).

Everything else (model, optimizer, schedule, gradient all-reduce, checkpoints, the `Policy`
handle a colocated rollout engine reads) is the `ActorWorker`'s. Sequence logprob = the
sum over response tokens (`baton.algos.sequence_logprobs`), at the actor's `temperature`
(online: the rollout temperature, the distribution the pairs were sampled from; offline: 1).
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.algos import dpo_loss, sequence_logprobs
from baton.algos.config import AlgoConfig
from baton.algos.dpo_config import DPOLossConfig
from baton.algos.logprobs import upcast
from baton.algos.rpo import chosen_nll
from baton.batch import Batch
from baton.controller import Dispatch, register
from baton.models.config import ModelConfig
from baton.models.precision import autocast
from baton.workers.actor import ActorConfig, ActorWorker
from baton.workers.sequences import response_logprobs

PAIR_PAD = "pair_pad"  # [B] bool: the row belongs to a padding pair (no loss, no metrics)
# What one DPO update reports, averaged over the real pairs of all ranks (dpo_loss's names;
# its "kl" is logged as dpo/kl).
PAIR_METRICS = ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                "logps/chosen", "logps/rejected", "dpo/kl", "dpo/nll")


def pair_rows(rows: Batch, chosen: torch.Tensor, rejected: torch.Tensor, multiple: int = 1) -> Batch:
    """Pair-major rows [c0, r0, c1, r1, ...] from row indices chosen [P], rejected [P] of
    `rows`, padded with copies of pair 0 (flagged `pair_pad`) to a multiple of `multiple`
    pairs (the dp size), so that dispatch gives every rank whole pairs."""
    if len(chosen) == 0:
        raise ValueError("pair_rows needs at least one pair")
    pad = (-len(chosen)) % multiple
    c = torch.cat([chosen, chosen[:1].repeat(pad)])  # [P']
    r = torch.cat([rejected, rejected[:1].repeat(pad)])  # [P']
    out = rows.rows(torch.stack([c, r], dim=1).flatten())  # [2P'] rows
    flag = torch.zeros(len(c), dtype=torch.bool)
    flag[len(chosen):] = True
    out[PAIR_PAD] = flag.repeat_interleave(2)  # [2P']
    return out


class DPOActorWorker(ActorWorker):
    """`DPOActorWorker(model, actor, dpo, temperature=, max_new_tokens=, total_steps=, seed=)`:
    its own sections (model, actor, dpo) plus the run facts the update depends on."""

    def __init__(self, model: ModelConfig, actor: ActorConfig, dpo: DPOLossConfig, *,
                 temperature: float, max_new_tokens: int, total_steps: int, seed: int):
        # The PPO loss settings (AlgoConfig) are unused here: the DPO loss is `dpo`'s.
        super().__init__(model, actor, AlgoConfig(), temperature=temperature,
                         max_new_tokens=max_new_tokens, total_steps=total_steps, seed=seed)
        self.dpo = dpo

    # --- the loss of one micro-batch of pairs --------------------------------------------
    def _pair_loss(self, micro: Batch, n_pairs: float) -> tuple[torch.Tensor, dict[str, float], int]:
        """(loss = sum of this micro-batch's real pair losses / n_pairs, metric sums, real pairs)."""
        d = self.dpo
        mask = micro[F.RESPONSE_MASK].float()  # [2p, R]
        with autocast(self.device, self.bf16):
            logp, _ = response_logprobs(self.model, micro, self.temperature,
                                        share_prompts=self.par.share_prompts)  # [2p, R]
        seq = sequence_logprobs(upcast(logp), mask.to(logp.device))  # [2p]
        real = ~micro[PAIR_PAD][0::2].to(seq.device)  # [p]
        n_real = int(real.sum())
        if n_real == 0:  # padding only: a zero loss that still gives every parameter a gradient
            return logp.sum() * 0.0, {}, 0
        lengths = mask.sum(-1).to(seq.device)  # [2p]
        ref = {}
        if not d.reference_free:
            ref_seq = sequence_logprobs(upcast(micro[F.REF_LOGPROBS]), mask).to(seq.device)  # [2p]
            ref = {"ref_chosen_logps": ref_seq[0::2][real], "ref_rejected_logps": ref_seq[1::2][real]}
        loss, stats = dpo_loss(
            d.loss, chosen_logps=seq[0::2][real], rejected_logps=seq[1::2][real], **ref,
            beta=d.beta, reference_free=d.reference_free, chosen_lengths=lengths[0::2][real],
            rejected_lengths=lengths[1::2][real], global_pairs=n_pairs, **d.loss_kwargs())
        sums = {("dpo/kl" if k == "kl" else k): float(v) * n_real for k, v in stats.items()}
        if d.nll_coef:  # RPO: keep the chosen response likely, not only likelier than the rejected
            nll = chosen_nll(seq[0::2][real], lengths[0::2][real], global_pairs=n_pairs)
            loss = loss + d.nll_coef * nll
            sums["dpo/nll"] = nll.item() * n_pairs
        return loss, sums, n_real

    @staticmethod
    def _check_pairs(batch: Batch) -> None:
        if batch.meta.get("_pad", 0) or len(batch) % 2:
            raise ValueError(f"update_dpo got {len(batch)} rows (dispatch padding "
                             f"{batch.meta.get('_pad', 0)}): a pair's rows would be split across "
                             f"ranks; build the batch with pair_rows(..., multiple=dp size)")

    def _pair_shuffled(self, batch: Batch, seed: int) -> Batch:
        """Whole pairs in a seeded random order (the two rows of a pair stay adjacent)."""
        perm = torch.randperm(len(batch) // 2, generator=torch.Generator().manual_seed(seed))  # [p]
        return batch.rows(torch.stack([2 * perm, 2 * perm + 1], dim=1).flatten())

    def _rows_per_rank(self, global_rows: int, rank_rows: int) -> int:
        """A global row count (mini/micro-batch size) as this rank's share, in whole pairs."""
        return max(2, (global_rows or rank_rows * self.dp_size) // self.dp_size // 2 * 2)

    # --- training ------------------------------------------------------------------------
    @register(dispatch=Dispatch.DP_COMPUTE)
    def update_dpo(self, batch: Batch) -> dict[str, float]:
        """Consumes pair-major rows (see the module docstring); produces metrics, the same on
        every rank (means over the real pairs of all ranks); takes one optimizer step per
        mini-batch (`actor.mini_batch_size` rows across ranks, 0 = all), for `actor.epochs`,
        through the actor's `OptimizerSteps` (clipping, non-finite skip, offload, schedule)."""
        self._check_pairs(batch)
        a = self.cfg
        sums: dict[str, float] = {}
        seen = [0]  # real pairs this rank saw, over every pass

        def prepare(mb: Batch) -> float:  # the mini-batch's real pairs over all ranks
            return max(self._all_reduce(torch.tensor(float((~mb[PAIR_PAD][0::2]).sum()))).item(), 1.0)

        def loss(mc: Batch, n_pairs: float) -> torch.Tensor:
            value, stats, n_real = self._pair_loss(mc, n_pairs)
            seen[0] += n_real
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
            return value

        self.model.train()
        metrics, _ = self.steps.run(
            batch, epochs=a.epochs, mini=self._rows_per_rank(a.mini_batch_size, len(batch)),
            micro=self._rows_per_rank(a.micro_batch_size, len(batch)), seed=self.seed,
            version=self.updates, shuffle=self._pair_shuffled, prepare=prepare, loss=loss)
        self.policy.version += 1
        return {**self._global_means(sums, seen[0]), **metrics}

    @register(dispatch=Dispatch.DP_COMPUTE)
    @torch.no_grad()
    def evaluate_dpo(self, batch: Batch) -> dict[str, float]:
        """The update's metrics on held-out pairs, without a step: eval/ prefixed means over
        the real pairs of all ranks, plus eval/loss (sum of pair losses / pairs)."""
        self._check_pairs(batch)
        self.model.eval()
        n_pairs = self._all_reduce(torch.tensor(float((~batch[PAIR_PAD][0::2]).sum()))).item()
        sums: dict[str, float] = {}
        loss_sum, seen = 0.0, 0
        for mc in batch.minibatches(self._rows_per_rank(self.cfg.micro_batch_size, len(batch)), shuffle=False):
            loss, stats, n_real = self._pair_loss(mc, max(n_pairs, 1.0))
            loss_sum += loss.item()
            seen += n_real
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
        out = {f"eval/{k}": v for k, v in self._global_means(sums, seen).items()}
        out["eval/loss"] = self._all_reduce(torch.tensor(loss_sum, dtype=torch.float64)).item()
        return out

    def _global_means(self, sums: dict[str, float], pairs: int) -> dict[str, float]:
        """Means over every real pair of every rank (all-reduced sums / all-reduced count) of
        the metrics this configuration reports."""
        d = self.dpo
        keys = [k for k in PAIR_METRICS if (k != "dpo/kl" or not d.reference_free) and (k != "dpo/nll" or d.nll_coef)]
        totals = self._all_reduce(torch.tensor([sums.get(k, 0.0) for k in keys] + [pairs], dtype=torch.float64))
        return {k: (totals[i] / totals[-1].clamp(min=1)).item() for i, k in enumerate(keys)}

    # --- weights for a reference refresh -------------------------------------------------
    @register(dispatch=Dispatch.ONE_TO_ALL_RANK0)  # every rank gathers (sharded); rank 0 answers
    def get_weights(self) -> dict[str, Any]:
        """A CPU copy of the policy's parameters, full tensors by name (what
        `ReferenceWorker.load_weights` takes)."""
        full = {k: v.to("cpu", copy=True) for k, v in self.par.full_state_dict_iter()}
        return full if self.rank == 0 else {}
