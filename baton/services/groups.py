"""Scored groups (the trajectory API's wire shape: tokens, masks with -100 on tokens not
trained, scores, optional inference_logprobs / policy_version / finish_reasons) as the rows
of a `Batch`: what the trainer pulls from `baton api` and what the OpenAI gateway records.

    prompt = the tokens before the first trained token (mask != -100), response = the rest,
    response_mask = mask != -100 (tokens an environment added mid-response, e.g. tool output,
    are not trained), inference_logprobs -> rollout_logprobs, scores -> rewards; per-turn
    rewards, when every sequence's `overrides` has `token_rewards` [[position, reward], ...]
    (baton.agents.api_env), -> token_rewards.
"""

from __future__ import annotations

from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch
from baton.padding import pad_left, pad_right


def groups_to_batch(groups: list[dict[str, Any]], tokenizer: Any, pad_id: int, group_size: int) -> Batch:
    """The rows of a batch of ScoredData groups (see the module docstring)."""
    prompts, responses, rmasks, logps, rewards, versions, finish, envs = [], [], [], [], [], [], [], []
    turn_rewards: list[list[list[float]] | None] = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for g in groups:
        n = len(g["tokens"])
        if n != group_size:
            raise ValueError(f"a group of {n} sequences from env {g.get('env_id')} does not match rollout.n="
                             f"{group_size}: the advantage estimator compares the samples of one group "
                             f"(set the environment's --group-size to {group_size})")
        lp_all = g.get("inference_logprobs") or None
        reasons = g.get("finish_reasons") or [None] * n
        for i, (toks, mask) in enumerate(zip(g["tokens"], g["masks"])):
            k = next((j for j, m in enumerate(mask) if m != -100), len(toks))
            prompts.append(list(toks[:k]))
            responses.append(list(toks[k:]))
            rmasks.append([int(m != -100) for m in mask[k:]])
            logps.append(None if lp_all is None else [float(x) for x in lp_all[i][k:]])
            rewards.append(float(g["scores"][i]))
            versions.append(int(g.get("policy_version") or 0))
            stop = reasons[i] or ("stop" if responses[-1] and responses[-1][-1] == eos else "length")
            finish.append("length" if stop == "length" else "stop")
            envs.append(g.get("env_id"))
            ov = (g.get("overrides") or [None] * n)[i] or {}
            turn_rewards.append([[p - k, r] for p, r in ov["token_rewards"]] if "token_rewards" in ov else None)
    p_ids, p_mask = pad_left([p or [pad_id] for p in prompts], pad_id)
    for i, p in enumerate(prompts):
        if not p:  # a sequence trained from its first token: nothing to condition on
            p_mask[i] = 0
    r_ids, _ = pad_right(responses, pad_id, torch.long)
    width = r_ids.shape[1]
    r_mask, _ = pad_right(rmasks, 0, torch.long, width=width)
    rows = Batch.from_dict({
        F.PROMPT_IDS: p_ids, F.PROMPT_MASK: p_mask, F.RESPONSE_IDS: r_ids, F.RESPONSE_MASK: r_mask,
        F.REWARDS: torch.tensor(rewards, dtype=torch.float32),
        F.POLICY_VERSION: torch.tensor(versions, dtype=torch.long),
        F.FINISH_REASON: finish,
        F.PROMPT_TEXT: tokenizer.batch_decode(prompts, skip_special_tokens=True),
        F.COMPLETION_TEXT: tokenizer.batch_decode(responses, skip_special_tokens=True),
    })
    if turn_rewards and all(t is not None for t in turn_rewards):
        tok_r = torch.zeros(r_ids.shape, dtype=torch.float32)
        for b, pairs in enumerate(turn_rewards):
            for p, r in pairs:
                tok_r[b, int(p)] += float(r)
        rows[F.TOKEN_REWARDS] = tok_r
    if all(lp is not None for lp in logps):
        rows[F.ROLLOUT_LOGPROBS], _ = pad_right(logps, 0.0, torch.float32, width=width)
    return rows
