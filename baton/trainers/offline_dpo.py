"""The offline DPO driver: preference pairs from a jsonl file, the same loss, config pieces,
metrics and checkpoints as online DPO.

    baton train recipes/offline_dpo_arithmetic.yaml data.path=pairs.jsonl [k=v ...]

Data: one JSON object per line, {"prompt": str, "chosen": str, "rejected": str}. The prompt
is tokenized as the rollout engine tokenizes prompts, each completion as plain text followed
by EOS (a sampled completion that stops ends with EOS too), so a model trained offline and
online sees the same sequences.

One step, top to bottom:
    pairs (next data.pairs_per_step rows of the seeded, resumable sampler) --encode_pairs-->
    pair-major rows --reference.compute_ref_logprobs--> reference logprobs
                    --actor.update_dpo--> new weights, rewards/*, logps/*, dpo/kl
Evaluation (trainer.eval_every, and at the start and the end): the same metrics on
`data.eval_path`'s pairs without a step (eval/rewards/accuracies, ...), and, with
`data.task`, held-out generation accuracy through a rollout engine colocated with the actor.

Logprobs are at temperature 1 (the model's own distribution). Departure from the DPO paper
(Rafailov et al. 2023): none in the loss; `dpo.ref_refresh_every` (iterative DPO) is
available here too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from baton import fields as F
from baton.batch import Batch, collate
from baton.data.prompts import PromptSampler
from baton.envs import get_task
from baton.models.load import load_tokenizer
from baton.trainers.dpo_config import OfflineDPOConfig
from baton.trainers.dpo_roles import (build_dpo_roles, maybe_refresh_reference, reference_state,
                                      restore_reference, with_ref_logprobs)
from baton.trainers.run import RunSession, evaluate, save_checkpoint
from baton.trainers.run_state import RunState
from baton.workers.dpo_actor import pair_rows
from baton.workers.rollout import pad_left, pad_right

PAIR_KEYS = ("prompt", "chosen", "rejected")


def load_pairs(path: str | Path) -> list[dict[str, str]]:
    """Rows of a jsonl of preference pairs; a row without a string prompt/chosen/rejected is
    an error naming the file and line."""
    rows = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        bad = [k for k in PAIR_KEYS if not isinstance(row.get(k), str)]
        if bad:
            raise ValueError(f"{path}:{lineno}: a pair needs string fields {list(PAIR_KEYS)}; "
                             f"missing or not a string: {bad}")
        rows.append({k: row[k] for k in PAIR_KEYS})
    if not rows:
        raise ValueError(f"{path} holds no pairs")
    return rows


def encode_pairs(tokenizer: Any, pairs: Batch, multiple: int = 1) -> Batch:
    """Pair-major model rows (chosen, rejected, chosen, ...) of text pairs, padded to a
    multiple of `multiple` pairs (see `baton.workers.dpo_actor.pair_rows`)."""
    prompts = [tokenizer(str(p)).input_ids for p in pairs["prompt"]]  # as RolloutWorker.generate
    eos = tokenizer.eos_token_id
    completions = [tokenizer(str(text), add_special_tokens=False).input_ids + [eos]
                   for c, r in zip(pairs["chosen"], pairs["rejected"]) for text in (c, r)]
    p_ids, p_mask = pad_left([p for p in prompts for _ in range(2)], tokenizer.pad_token_id)  # [2P, Pl]
    r_ids, r_mask = pad_right(completions, tokenizer.pad_token_id, torch.long)  # [2P, R]
    rows = Batch({F.PROMPT_IDS: p_ids, F.PROMPT_MASK: p_mask, F.RESPONSE_IDS: r_ids, F.RESPONSE_MASK: r_mask})
    n = len(prompts)
    return pair_rows(rows, torch.arange(0, 2 * n, 2), torch.arange(1, 2 * n, 2), multiple)


class PairFileSource:
    """The row source of offline DPO: the next `data.pairs_per_step` pairs of the file (the
    run's seeded, resumable sampler), encoded pair-major. A colocated rollout engine (held-out
    generation accuracy) is told each new version."""

    def __init__(self, cfg: OfflineDPOConfig, tokenizer: Any, state: RunState, rollout: Any) -> None:
        self.cfg, self.tokenizer, self.state, self.rollout = cfg, tokenizer, state, rollout

    def rows(self, step: int) -> Batch:
        return encode_pairs(self.tokenizer, self.state.next_prompts(self.cfg.data.pairs_per_step),
                            multiple=self.cfg.placement.world_size)

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        if self.rollout is not None:  # colocated: tags the engine with the new version
            return self.rollout.sync_weights(version, check=check)
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}  # the sampler's position is saved by RunState

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def train(cfg: OfflineDPOConfig) -> dict[str, float]:
    d = cfg.dpo
    with RunSession(cfg) as run:
        tokenizer = load_tokenizer(cfg.model.path)
        train_pairs = load_pairs(cfg.data.path)
        eval_pairs = (encode_pairs(tokenizer, collate(load_pairs(cfg.data.eval_path)), cfg.placement.world_size)
                      if cfg.data.eval_path else None)
        task_rows = get_task(cfg.data.task).eval_rows(cfg.data.eval_size) if cfg.data.task else []
        state = RunState(sampler=PromptSampler(train_pairs, seed=cfg.data.seed), eval_rows=task_rows)
        run.roles = roles = build_dpo_roles(
            cfg, temperature=1.0, task=cfg.data.task,
            probe_prompt=task_rows[0]["prompt"] if task_rows else train_pairs[0]["prompt"])
        actor, ref, rollout = roles["actor"], roles.get("reference"), roles.get("rollout")
        source = PairFileSource(cfg, tokenizer, state, rollout)

        def evaluation() -> dict[str, float]:
            out = evaluate(rollout, state.eval_rows) if rollout is not None else {}
            if eval_pairs is not None:
                out.update(actor.evaluate_dpo(with_ref_logprobs(ref, eval_pairs))[0])
            return out

        def restore(path: str) -> None:
            saved = actor.load_checkpoint(path)[0]
            state.restore(saved)
            restore_reference(roles, saved)
            source.weights_updated(state.step)

        run.start(state, restore=restore, evaluate=evaluation)
        for step, timed in run.steps():
            batch = source.rows(step)
            with timed("reference"):
                batch = with_ref_logprobs(ref, batch)
            with timed("update"):  # skips optimizer steps whose loss/grad is not finite
                metrics = {**actor.update_dpo(batch)[0], "dpo/pairs": cfg.data.pairs_per_step}
            source.weights_updated(step)
            metrics["dpo/ref_refreshed"] = int(maybe_refresh_reference(roles, d.ref_refresh_every, step))
            run.end_step(step, metrics, save=lambda: save_checkpoint(
                actor, run.run, run.t, step, {**state.to_dict(), **reference_state(roles, d.ref_refresh_every, step)}))
    return run.result()
