"""The rollout role: samples `rollout.n` completions per prompt with the current policy.

Consumes a Batch of prompts (text + task fields such as `answer`); produces the
rows of the step: prompt/response ids and masks, the engine's behaviour logprobs, the
finish reason, the decoded completion and the policy version that sampled each row.

Colocated with the actor (the default), the engine is handed the actor's own module and
reads its parameters in place: no copy, and "weight sync" is a version bump.
"""

from __future__ import annotations

import torch

from baton import fields as F
from baton.batch import PAD_KEY, Batch
from baton.controller import Dispatch, Execute, Worker, register
from baton.envs import TASKS
from baton.envs.evaluate import evaluate
from baton.rollout.engine import EmbeddedEngine
from baton.rollout.protocol import Completion, SamplingParams
from baton.sync.base import check_logprob_parity
from baton.trainers.grpo_config import GRPOConfig


def pad_left(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s):] = torch.tensor(s)
            mask[i, width - len(s):] = 1
    return ids, mask  # [B, P], [B, P]


def pad_right(seqs: list[list], pad: float | int, dtype: torch.dtype, width: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    width = width or max(1, max(len(s) for s in seqs))
    out = torch.full((len(seqs), width), pad, dtype=dtype)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, :len(s)] = torch.tensor(s, dtype=dtype)
        mask[i, :len(s)] = 1
    return out, mask  # [B, R], [B, R]


def completions_to_batch(prompts: Batch, prompt_ids: list[list[int]], done: list[Completion],
                         n: int, pad_id: int, tokenizer) -> Batch:
    """Rows of the step, prompt-major: the n samples of prompt i sit at rows i*n .. i*n+n-1."""
    rows = prompts.repeat(n, interleave=True)
    p_ids, p_mask = pad_left([prompt_ids[c.prompt_index] for c in done], pad_id)
    r_ids, r_mask = pad_right([c.token_ids for c in done], pad_id, torch.long)
    r_logp, _ = pad_right([c.logprobs for c in done], 0.0, torch.float32, width=r_ids.shape[1])
    rows[F.PROMPT_IDS], rows[F.PROMPT_MASK] = p_ids, p_mask
    rows[F.RESPONSE_IDS], rows[F.RESPONSE_MASK] = r_ids, r_mask
    rows[F.ROLLOUT_LOGPROBS] = r_logp
    rows[F.POLICY_VERSION] = torch.tensor([c.version for c in done], dtype=torch.long)
    rows[F.FINISH_REASON] = [c.finish_reason for c in done]
    rows[F.COMPLETION_TEXT] = tokenizer.batch_decode([c.token_ids for c in done], skip_special_tokens=True)
    return rows


class RolloutWorker(Worker):
    def __init__(self, cfg: GRPOConfig):
        super().__init__()
        self.cfg = cfg
        actor = self.sibling("actor")  # colocated: share the module, no copy
        self.tokenizer = actor.tokenizer
        # fuse_weights=False: read the actor's parameters as they are, no packed copy
        # (measured: no slower for the demo model, bench/engine_throughput.py has the rest).
        self.engine = EmbeddedEngine(actor.model, self.tokenizer, fuse_weights=False)
        self.calls = 0

    def sampling_params(self, greedy: bool = False, seed: int | None = None) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(n=1 if greedy else r.n, temperature=0.0 if greedy else r.temperature,
                              top_p=r.top_p, top_k=r.top_k, max_new_tokens=r.max_new_tokens, seed=seed)

    @register(dispatch=Dispatch.DP_COMPUTE)
    def generate(self, prompts: Batch) -> Batch:
        """Consumes prompts (text); produces len(prompts) * n rows (see module docstring)."""
        step = prompts.meta.get("step", self.calls)
        self.calls += 1
        # Seeded per step and rank: a resumed run samples exactly what the first run would have.
        seed = self.cfg.trainer.seed * 1_000_003 + step * 1009 + self.dp_rank
        ids = [self.tokenizer(str(p)).input_ids for p in prompts[F.PROMPT_TEXT]]
        params = self.sampling_params(greedy=bool(prompts.meta.get("greedy")), seed=seed)
        done = self.engine.generate(ids, params)
        rows = completions_to_batch(prompts, ids, done, params.n, self.tokenizer.pad_token_id,
                                    self.tokenizer)
        # Dispatch padding rows of the prompts became n padding rows each: let concat drop them.
        rows.meta[PAD_KEY] = prompts.meta.get(PAD_KEY, 0) * params.n
        return rows

    @register(dispatch=Dispatch.ONE_TO_ALL)
    def sync_weights(self, version: int) -> float | None:
        """Colocated in place: the engine already reads the updated parameters.

        With trainer.check_weight_sync, returns max |engine - trainer| logprob on a fixed
        prompt (the runtime check that the engine samples from the policy being trained)."""
        self.engine.version = version
        if not self.cfg.trainer.check_weight_sync:
            return None
        probe = self.tokenizer("1+2+3=").input_ids
        return check_logprob_parity(self.engine, self.sibling("actor").model, probe, max_new_tokens=4)

    @register(dispatch=Dispatch.ONE_TO_ALL, execute=Execute.RANK_ZERO)
    def evaluate(self, rows: list[dict], greedy: bool) -> float:
        """Held-out accuracy with the current weights (greedy, or 4 samples per prompt)."""
        r = self.cfg.rollout
        return evaluate(self.engine, self.tokenizer, TASKS[self.cfg.data.task], rows, greedy, n=4,
                        max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                        seed=self.cfg.trainer.seed)["accuracy"]
