"""Scored groups (the trajectory API's wire shape: tokens, masks with -100 on tokens not
trained, scores, optional inference_logprobs / policy_version / finish_reasons) as the rows
of a `Batch`: what the trainer pulls from `baton api` and what the OpenAI gateway records.

    prompt = the tokens before the first trained token (mask != -100), response = the rest,
    response_mask = mask != -100 (tokens an environment added mid-response, e.g. tool output,
    are not trained), inference_logprobs -> rollout_logprobs, scores -> rewards; per-turn
    rewards of a sequence whose `overrides` has `token_rewards` [[position, reward], ...]
    (baton.agents.api_env) -> token_rewards; each group is a group (`baton.rows.to_batch`).
"""

from __future__ import annotations

from typing import Any

from baton.batch import Batch
from baton.rows import Trajectory, to_batch


def split_sequence(tokens: list[int], mask: list[int], trained=lambda m: m != -100) -> tuple[list[int], list[int], list[int]]:
    """(prompt, response, response loss mask) of one sequence: the prompt is the tokens before
    the first trained one (`trained(mask value)`), the response the rest."""
    k = next((j for j, m in enumerate(mask) if trained(m)), len(tokens))
    return list(tokens[:k]), list(tokens[k:]), [int(trained(m)) for m in mask[k:]]


def finish_of(reason: str | None, response: list[int], eos: int | None) -> str:
    """"stop" or "length": the sequence's own reason, else whether it ends with EOS."""
    stop = reason or ("stop" if response and response[-1] == eos else "length")
    return "length" if stop == "length" else "stop"


def groups_to_batch(groups: list[dict[str, Any]], tokenizer: Any, pad_id: int, group_size: int) -> Batch:
    """The rows of a batch of ScoredData groups (see the module docstring), group g's rows in
    group g."""
    trajs = []
    eos = getattr(tokenizer, "eos_token_id", None)
    for gi, g in enumerate(groups):
        n = len(g["tokens"])
        if n != group_size:
            raise ValueError(f"a group of {n} sequences from env {g.get('env_id')} does not match rollout.n="
                             f"{group_size}: the advantage estimator compares the samples of one group "
                             f"(set the environment's --group-size to {group_size})")
        lp_all = g.get("inference_logprobs") or None
        reasons = g.get("finish_reasons") or [None] * n
        for i, (toks, mask) in enumerate(zip(g["tokens"], g["masks"])):
            prompt, response, rmask = split_sequence(toks, mask)
            k = len(prompt)
            ov = (g.get("overrides") or [None] * n)[i] or {}
            trajs.append(Trajectory(
                prompt, response, loss_mask=rmask, reward=float(g["scores"][i]),
                logprobs=None if lp_all is None else [float(x) for x in lp_all[i][k:]],
                token_rewards=[(p - k, r) for p, r in ov["token_rewards"]] if "token_rewards" in ov else None,
                version=int(g.get("policy_version") or 0), finish_reason=finish_of(reasons[i], response, eos),
                group=gi))
    return to_batch(trajs, pad_id, tokenizer)
