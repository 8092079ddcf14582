"""The training row: one `Trajectory` per sampled sequence, and the one `to_batch` that pads
them into the `Batch` an update sees (`baton.fields` names its columns).

Every row source builds Trajectories: the colocated rollout's completions
(`baton.workers.rollout`), agent episodes (`baton.agents.rollout`), the trajectory API's
scored groups (`baton.services.groups`) and the gateway's sessions
(`baton.services.gateway_rows`). So the rows of every source have the same columns, padded
the same way (prompts left, responses right: `baton.padding`), and the driver reads them
without asking which are there:

    group_index        always (the rows of one prompt share it: the estimators' groups)
    token_rewards      always, with has_token_rewards [B]: rows whose source placed rewards
                       on tokens (agents' per-turn rewards, an environment's overrides); the
                       driver puts the scalar reward on the last token of the others
    rewards            when the source scored the rows (`SourceSpec.scored`)
    rollout_logprobs   when every trajectory has behaviour logprobs
    routing            when every trajectory has the experts its tokens came from (routing
                       replay: `extra["routing"]` [tokens, MoE layers, K], padded with -1)
    token_versions     when some trajectory says which weight version sampled each token
                       (agents' turns, gateway sessions: the weights may change between
                       turns); the others' tokens are their `version`'s, -1 off the policy
                       and on padding. `policy_version` [B] stays the row's oldest;
                       `spanning_versions` counts the rows whose tokens span versions

A row whose tokens span versions needs nothing else from the update: its behaviour logprobs
are per token, each from the weights that sampled that token, so the off-policy correction
(`baton.algos.off_policy`) weighs every token by its own sampler.

Adding a row field is one dataclass field and one `Column` (tests/test_rows.py shows it
with a teacher's logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from baton import fields as F
from baton.batch import PAD_KEY, Batch
from baton.padding import pad_left, pad_right

@dataclass
class Trajectory:
    """One sampled sequence, unpadded. Positions in `token_rewards` count from the first
    response token."""
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float] | None = None  # behaviour logprobs, one per response token
    loss_mask: list[int] | None = None  # 1 on trained response tokens; None: all of them
    reward: float | None = None  # scalar reward; None: scored later, or the sum of token_rewards
    token_rewards: list[tuple[int, float]] | None = None  # (position, reward), added up in order
    version: int = 0  # the policy version that sampled it (the oldest, when its tokens span versions)
    # the weight version that sampled each response token, -1 on tokens the policy did not
    # sample (mask 0: an environment's, a chat template's); None: every token `version`'s
    token_versions: list[int] | None = None
    finish_reason: str = "stop"  # "stop" | "length"
    group: int = 0  # rows of one prompt share it
    prompt_row: int | None = None  # the row of `to_batch(prompts=)` whose task fields it carries
    extra: dict[str, Any] = field(default_factory=dict)  # a source's own per-row values, by column


@dataclass(frozen=True)
class Column:
    """A tensor column: `Trajectory.attr` (or `extra[attr]`) of every row as `key`, per
    response token padded right with `pad` [B, R], else one value a row [B]; present when
    every trajectory has a value (not None)."""
    attr: str
    key: str
    pad: float | int
    dtype: torch.dtype
    per_token: bool = True

    def values(self, trajs: Sequence[Trajectory], width: int) -> torch.Tensor | None:
        values = [getattr(t, self.attr) if hasattr(t, self.attr) else t.extra.get(self.attr) for t in trajs]
        if any(v is None for v in values):
            return None
        if not self.per_token:
            return torch.tensor(values, dtype=self.dtype)
        inner = torch.as_tensor(values[0]).shape[1:]  # per token: a value, or a tensor (routing)
        if inner:
            out = torch.full((len(values), width, *inner), self.pad, dtype=self.dtype)
            for i, v in enumerate(values):
                out[i, :len(v)] = torch.as_tensor(v, dtype=self.dtype)
            return out
        return pad_right(values, self.pad, self.dtype, width=width)[0]


COLUMNS: tuple[Column, ...] = (Column("logprobs", F.ROLLOUT_LOGPROBS, 0.0, torch.float32),
                               Column("routing", F.ROUTING, -1, torch.long))


def to_batch(trajs: Sequence[Trajectory], pad_id: int, tokenizer: Any, prompts: Batch | None = None,
             columns: Sequence[Column] = COLUMNS) -> Batch:
    """The rows of `trajs`, in order, padded once (see the module docstring). With `prompts`,
    each row carries its `prompt_row`'s fields (task fields such as `answer`, the prompt
    text; the rows of dispatch-padding prompts stay trailing padding); without, the prompt
    decoded as `prompt`. An empty prompt (a sequence trained from its first token) is one
    pad token under mask 0."""
    if prompts is not None:
        idx = [t.prompt_row for t in trajs]
        out = prompts.rows(idx)
        first_pad = len(prompts) - prompts.meta.get(PAD_KEY, 0)
        pad_rows = sum(i >= first_pad for i in idx)
        if pad_rows:
            assert all(i >= first_pad for i in idx[len(idx) - pad_rows:]), "padding prompts' rows must be last"
            out.meta[PAD_KEY] = pad_rows
    else:
        out = Batch()
        out[F.PROMPT_TEXT] = tokenizer.batch_decode([t.prompt_ids for t in trajs], skip_special_tokens=True)
    p_ids, p_mask = pad_left([t.prompt_ids or [pad_id] for t in trajs], pad_id)
    for i, t in enumerate(trajs):
        if not t.prompt_ids:
            p_mask[i] = 0
    r_ids, r_mask = pad_right([t.response_ids for t in trajs], pad_id, torch.long)
    width = r_ids.shape[1]
    if any(t.loss_mask is not None for t in trajs):
        r_mask, _ = pad_right([t.loss_mask if t.loss_mask is not None else [1] * len(t.response_ids) for t in trajs],
                              0, torch.long, width=width)
    out[F.PROMPT_IDS], out[F.PROMPT_MASK] = p_ids, p_mask
    out[F.RESPONSE_IDS], out[F.RESPONSE_MASK] = r_ids, r_mask
    for c in columns:
        values = c.values(trajs, width)
        if values is not None:
            out[c.key] = values
    tok_r = torch.zeros(r_ids.shape, dtype=torch.float32)
    for b, t in enumerate(trajs):
        for p, r in t.token_rewards or ():
            tok_r[b, int(p)] += float(r)
    has = torch.tensor([t.token_rewards is not None for t in trajs], dtype=torch.bool)
    out[F.TOKEN_REWARDS], out[F.HAS_TOKEN_REWARDS] = tok_r, has
    unscored = [t.reward is None for t in trajs]
    if not all(unscored) or has.any():
        if any(u and t.token_rewards is None for u, t in zip(unscored, trajs)):
            raise ValueError("to_batch: some trajectories are scored and some are not")
        rewards = torch.tensor([0.0 if t.reward is None else t.reward for t in trajs], dtype=torch.float32)
        out[F.REWARDS] = torch.where(torch.tensor(unscored), tok_r.sum(1), rewards) if any(unscored) else rewards
    out[F.GROUP_INDEX] = torch.tensor([t.group for t in trajs], dtype=torch.long)
    out[F.POLICY_VERSION] = torch.tensor([t.version for t in trajs], dtype=torch.long)
    if any(t.token_versions is not None for t in trajs):
        out[F.TOKEN_VERSIONS] = pad_right([_token_versions(t) for t in trajs], -1, torch.long, width=width)[0]
    out[F.FINISH_REASON] = [t.finish_reason for t in trajs]
    out[F.COMPLETION_TEXT] = tokenizer.batch_decode([t.response_ids for t in trajs], skip_special_tokens=True)
    for key in dict.fromkeys(k for t in trajs for k in t.extra if k not in {c.attr for c in columns}):
        out[key] = [t.extra.get(key) for t in trajs]  # per-row values of no column: as they are
    return out


def _token_versions(t: Trajectory) -> list[int]:
    if t.token_versions is not None:
        if len(t.token_versions) != len(t.response_ids):
            raise ValueError(f"to_batch: {len(t.token_versions)} token versions for {len(t.response_ids)} response tokens")
        return list(t.token_versions)
    mask = t.loss_mask if t.loss_mask is not None else [1] * len(t.response_ids)
    return [t.version if m else -1 for m in mask]


def spanning_versions(rows: Batch) -> int:
    """How many rows' sampled tokens came from more than one weight version (0 without a
    `token_versions` column: every row's tokens are its `policy_version`'s)."""
    if F.TOKEN_VERSIONS not in rows.tensors:
        return 0
    v = rows[F.TOKEN_VERSIONS]  # [B, R], -1 off the policy
    sampled = v >= 0
    hi = torch.where(sampled, v, -1).amax(1)  # [B]
    lo = torch.where(sampled, v, torch.iinfo(v.dtype).max).amin(1)  # [B]
    return int((sampled.any(1) & (hi > lo)).sum())


def group_ids(prompts: Batch, offset: int = 0) -> list[int]:
    """Each prompt row's group: the `group_index` its source gave it (unique across the
    step's ranks and draws), else offset + its row."""
    if F.GROUP_INDEX in prompts:
        return prompts[F.GROUP_INDEX].tolist()
    return [offset + i for i in range(len(prompts))]


__all__ = ["COLUMNS", "Column", "Trajectory", "group_ids", "spanning_versions", "to_batch"]
