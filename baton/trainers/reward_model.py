"""`baton rm RECIPE`: train a Bradley-Terry reward model from preference pairs.

    baton train recipes/rm_arithmetic.yaml [dotted.key=value ...]

Data: a jsonl of {"prompt", "chosen", "rejected"} (`data.path`), or, with `data.path: ""`,
pairs made from a task's rows (`data.task`): chosen = the task's target answer, rejected = a
wrong one (the answer with one digit changed). The model starts from any local causal-LM
(or reward-model) directory with a new scalar `score` head (`load_reward_model`), reads
`prompt + response + EOS` and scores the last token (`encode_pair` / `sequence_scores`, the
same functions the reward-model role scores with). Loss: -log sigmoid(r_chosen - r_rejected),
mean over pairs (Ouyang et al. 2022, one pair per prompt).

The run is a run like any other (`baton.trainers.session.in_process.fit` inside a `RunSession`, as
SFT's): locked run dir, config.yaml, metrics.jsonl (rm/loss, rm/accuracy = P(r_chosen >
r_rejected), rm/margin, grad norm, lr), held-out pair accuracy at the start and the end,
atomic checkpoints `checkpoints/step_N` (HF sequence-classification dirs that
`reward_model.path` and `critic.path` load) that `trainer.resume=auto` continues from, and
`trainer.save_path` to export the final model elsewhere too.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from torch.nn import functional

from baton.data.prompts import PromptSampler
from baton.data.records import load_pairs as read_pairs
from baton.envs import TASKS, get_task
from baton.models import load_tokenizer
from baton.trainers.report.samples import SampleLog
from baton.trainers.session.in_process import InProcessTrainerConfig, fit, place
from baton.trainers.session.run import RunSession
from baton.trainers.session.state import RunState
from baton.workers.optim import OptimConfig, Schedule
from baton.workers.reward_model import encode_pair, load_reward_model, pad_right, sequence_scores


@dataclass
class RMModelConfig:
    path: str = "checkpoints/arith-sft"  # a local HF dir: causal LM (new head) or reward model
    seed: int = 0  # init seed of a new head


@dataclass
class RMDataConfig:
    FILE_KIND: ClassVar[str] = "pairs"  # how its file is checked (baton.trainers.session.inputs)
    path: str = ""  # jsonl of {prompt, chosen, rejected}; "" = pairs made from `task`
    task: str = "arithmetic"  # used when path is ""
    num_pairs: int = 4000  # pairs made from the task
    eval_fraction: float = 0.1  # held-out pairs (the last ones)
    max_length: int = 512
    seed: int = 0  # the order of the training pairs

    def check(self) -> None:
        if self.path and not Path(self.path).is_file():
            raise ValueError(f"data.path={self.path!r} is not a file")
        if not self.path and self.task not in TASKS:
            raise ValueError(f"data.task={self.task!r} is not one of {sorted(TASKS)}")
        if not 0 <= self.eval_fraction < 1 or self.num_pairs < 2:
            raise ValueError("data.eval_fraction must be in [0, 1) and data.num_pairs >= 2")


@dataclass
class RMOptimConfig(OptimConfig):
    """`optim:`: the shared optimizer settings (`OptimConfig`) with the reward model's defaults."""
    lr: float = 1e-4
    lr_warmup_steps: int = 10
    lr_schedule: Schedule = "cosine"
    min_lr_ratio: float = 0.1


@dataclass
class RMConfig:
    algorithm: Literal["rm"] = "rm"
    model: RMModelConfig = field(default_factory=RMModelConfig)
    data: RMDataConfig = field(default_factory=RMDataConfig)
    optim: RMOptimConfig = field(default_factory=RMOptimConfig)
    trainer: InProcessTrainerConfig = field(default_factory=lambda: InProcessTrainerConfig(
        steps=200, batch_size=32, run_dir="runs/rm"))

    def __post_init__(self) -> None:
        self.data.check()
        self.trainer.check()
        self.optim.check_optim("optim")


def wrong_answer(answer: str, rng: random.Random) -> str:
    """`answer` with one digit changed (never equal to it)."""
    i = rng.randrange(len(answer))
    digits = [d for d in "0123456789" if d != answer[i] and not (i == 0 and d == "0" and len(answer) > 1)]
    return answer[:i] + rng.choice(digits) + answer[i + 1:]


def task_pairs(task_name: str, n: int, seed: int) -> list[dict[str, str]]:
    """n preference pairs from a task's training rows: the target beats a near miss."""
    task, rng = get_task(task_name), random.Random(seed)
    rows = task.train_rows(n, seed=seed)
    return [{"prompt": r["prompt"], "chosen": task.target(r), "rejected": wrong_answer(task.target(r), rng)}
            for r in rows]


def load_pairs(data: RMDataConfig) -> list[dict[str, str]]:
    if not data.path:
        return task_pairs(data.task, data.num_pairs, data.seed)
    return read_pairs(data.path)  # checked rows (baton.data.records): one line naming the line and field


def pair_scores(model, tokenizer, pairs: list[dict[str, str]], max_length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r_chosen [N], r_rejected [N]): one forward over the 2N sequences."""
    seqs = [encode_pair(tokenizer, p["prompt"], p[k], max_length) for k in ("chosen", "rejected") for p in pairs]
    ids, mask = pad_right(seqs, tokenizer.pad_token_id)  # [2N, T]
    scores = sequence_scores(model, ids, mask)  # [2N]
    return scores[:len(pairs)], scores[len(pairs):]


def bt_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
    """Bradley-Terry loss -log sigmoid(r_c - r_r), mean over pairs; accuracy and margin."""
    margin = chosen - rejected  # [N]
    loss = -functional.logsigmoid(margin).mean()
    return loss, {"accuracy": (margin > 0).float().mean().item(), "margin": margin.mean().item()}


@torch.no_grad()
def evaluate_pairs(model, tokenizer, pairs: list[dict[str, str]], max_length: int, batch: int = 128) -> dict[str, float]:
    was = model.training
    model.eval()
    margins = []
    for i in range(0, len(pairs), batch):
        c, r = pair_scores(model, tokenizer, pairs[i:i + batch], max_length)
        margins.append(c - r)
    model.train(was)
    m = torch.cat(margins)
    return {"eval/accuracy": (m > 0).float().mean().item(), "eval/margin": m.mean().item(),
            "eval/loss": -functional.logsigmoid(m).mean().item()}


@torch.no_grad()
def pair_samples(model, tokenizer, pairs: list[dict[str, str]], max_length: int, step: int,
                 k: int = 8) -> list[dict[str, Any]]:
    """samples.jsonl's lines for a reward-model evaluation: the first `k` held-out pairs, the
    chosen answer as the completion with its score as the reward, the rejected one beside it."""
    was = model.training
    model.eval()
    chosen, rejected = pair_scores(model, tokenizer, pairs[:k], max_length)
    model.train(was)
    return [{"step": step, "prompt": p["prompt"], "completion": p["chosen"], "reward": round(float(c), 6),
             "rejected": p["rejected"], "rejected_reward": round(float(r), 6)}
            for p, c, r in zip(pairs[:k], chosen.tolist(), rejected.tolist())]


def run_rm(cfg: RMConfig) -> dict[str, Any]:
    t, o = cfg.trainer, cfg.optim
    with RunSession(cfg) as run:
        pairs = load_pairs(cfg.data)
        n_eval = int(len(pairs) * cfg.data.eval_fraction)
        train_pairs, eval_pairs = pairs[:len(pairs) - n_eval], pairs[len(pairs) - n_eval:]
        model = place(load_reward_model(cfg.model.path, seed=cfg.model.seed).train(), t)  # trainer.device
        tokenizer = load_tokenizer(cfg.model.path)
        optim, sched = o.build(model, t.steps)
        state = RunState(sampler=PromptSampler(train_pairs, seed=cfg.data.seed), eval_rows=[])
        print(f"rm: {len(train_pairs)} training pairs, {len(eval_pairs)} held out, {t.steps} steps x {t.batch_size}")

        def loss_fn(model, rows) -> tuple[torch.Tensor, dict[str, float]]:
            return bt_loss(*pair_scores(model, tokenizer, rows, cfg.data.max_length))

        samples = SampleLog(run.path, t.eval_every, t.steps)

        def evaluate() -> dict[str, float]:  # at step 0, every trainer.eval_every steps and the last
            samples.write_records(state.step, pair_samples(model, tokenizer, eval_pairs, cfg.data.max_length,
                                                           state.step))
            return evaluate_pairs(model, tokenizer, eval_pairs, cfg.data.max_length)

        result = fit(run, o.grad_clip, model, tokenizer, optim, sched, state, loss_fn,
                     evaluate if eval_pairs else None, prefix="rm", evaluate_at_start=True)
    if eval_pairs:
        print(f"rm held-out pair accuracy ({len(eval_pairs)} pairs): start {result['start/eval/accuracy']:.3f} "
              f"-> {result['eval/accuracy']:.3f}")
    return result
