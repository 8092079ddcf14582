"""Supervised warm start: teach a (tiny) model a task's answer format before GRPO.

    baton train recipes/sft_arithmetic.yaml [trainer.steps=N trainer.save_path=DIR ...]

The loss is next-token cross-entropy on the completion tokens only (target + EOS); the
prompt tokens are context, not targets. Batches come from the run's resumable
`PromptSampler`, so the data order is a function of the seed. The run is a run like any
other (`baton.trainers.session.in_process.fit` inside a `RunSession`): locked run dir, config.yaml,
metrics.jsonl (`sft/loss` on the progress line and in report.png), atomic HF checkpoints in
`checkpoints/step_N` that `trainer.resume=auto` continues from exactly, and the held-out
accuracy (greedy and sampled, through the embedded rollout engine) at step 0, every
`trainer.eval_every` steps and at the end, with a few greedy held-out completions in
samples.jsonl. `trainer.save_path` also exports the final model (nothing is
exported by default: the shipped `checkpoints/arith-sft` is never overwritten by accident).

    cfg = SFTConfig(model=SFTModelConfig(preset="0.75m"), trainer=InProcessTrainerConfig(steps=5))
    result = run_sft(cfg)  # {"loss_first": ..., "loss_last": ..., "eval/accuracy_greedy": ...}

Rows: a task's (`data.task`: a built-in name or a user's `module:Class`, as `baton train`
takes) or a file's (`data.path`, `data.eval_path`: the row shapes of docs/OWN_DATA.md, held
out as `baton train` holds them out). The target of a row is its `target` field when it has
one, else the task's `target(row)` (the built-in tasks: the row's `answer`); the held-out
evaluation scores with the task's verifier (`is_correct`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch
from torch.nn import functional

from baton.models.presets import PRESETS
from baton.data.prompts import PromptSampler
from baton.data.records import render_prompt
from baton.envs import configured_task, get_task
from baton.envs.evaluate import evaluate_modes
from baton.models import build_char_tokenizer, build_tiny_model, count_params, load_model, load_tokenizer
from baton.padding import pad_right
from baton.trainers.report.samples import SampleLog
from baton.trainers.session.in_process import InProcessTrainerConfig, fit, place
from baton.trainers.session.run import RunSession
from baton.trainers.session.config import DataConfig, check_task
from baton.trainers.session.state import RunState, task_rows
from baton.workers.optim import OptimConfig, Schedule

IGNORE = -100  # label of tokens that carry no loss (prompt, padding)


@dataclass
class SFTModelConfig:
    path: str | None = None  # a local HF dir to start from; None builds a tiny model
    preset: str = "0.75m"  # baton.models.tiny.PRESETS key, used when path is None
    # the tiny model's architecture: qwen2 | llama | qwen3_moe | mixtral; None: the preset's own
    # (the qwen3-moe and mixtral presets are of their family), else qwen2
    family: Literal["qwen2", "llama", "qwen3_moe", "mixtral"] | None = None
    overrides: dict[str, int] = field(default_factory=dict)  # tiny_config args, e.g. {layers: 2}
    seed: int = 0  # init seed of a fresh tiny model

    def check_family(self) -> None:  # not `check`: `check_inputs` checks model.path when there is none
        own = PRESETS.get(self.preset, {}).get("family")
        if own is not None and self.family not in (None, own):
            raise ValueError(f"model.preset={self.preset} is a {own} model; model.family={self.family} would be ignored "
                             f"(drop it)")

    @property
    def tiny_family(self) -> str:
        return self.family or str(PRESETS.get(self.preset, {}).get("family", "qwen2"))


@dataclass
class SFTDataConfig:
    TARGET_FIELD: ClassVar[str] = "target"  # a training row's own completion (else the task's target of it)
    task: str = "arithmetic"  # a name in baton.envs.TASKS, or a user task module:Class
    task_args: dict[str, Any] = field(default_factory=dict)  # the task's configure(**task_args) (reasoning_gym)
    path: str = ""  # rows from a local jsonl / parquet file instead of the task's (docs/OWN_DATA.md)
    eval_path: str = ""  # held-out rows from a file ("" = every 10th row of `path`, or the task's split)
    num_examples: int = 20_000  # training rows (at most: a file's rows are all of them)
    seed: int = 0  # which training rows, and their order
    eval_size: int = 200  # held-out prompts for the evaluation (0 skips it)
    eval_samples: int = 4  # samples per held-out prompt for the sampled (T=1) accuracy

    def check(self) -> None:
        check_task(self.task, self.task_args)
        if self.eval_path and not self.path:
            raise ValueError("data.eval_path is read only with data.path (a task's held-out rows are its own)")
        if self.num_examples < 1 or self.eval_size < 0 or self.eval_samples < 1:
            raise ValueError("data.num_examples and data.eval_samples must be >= 1, data.eval_size >= 0")


@dataclass
class SFTOptimConfig(OptimConfig):
    """`optim:`: the shared optimizer settings (`OptimConfig`) with SFT's defaults."""
    lr: float = 3e-3
    lr_warmup_steps: int = 50
    lr_schedule: Schedule = "cosine"
    min_lr_ratio: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    # PyTorch's default AdamW, not the fused kernel the actor uses: their last bits differ, and
    # over 180 steps that changes the weights.
    fused: bool = False


@dataclass
class SFTConfig:
    algorithm: Literal["sft"] = "sft"
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: InProcessTrainerConfig = field(default_factory=lambda: InProcessTrainerConfig(
        steps=180, run_dir="runs/sft"))

    def __post_init__(self) -> None:
        self.model.check_family()
        self.data.check()
        self.trainer.check()
        self.optim.check_optim("optim")


def build_model_and_tokenizer(cfg: SFTModelConfig):
    if cfg.path is not None:
        return load_model(cfg.path).train(), load_tokenizer(cfg.path)
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.preset, family=cfg.tiny_family, vocab_size=len(tok), seed=cfg.seed, **cfg.overrides)
    return model.train(), tok


def sft_rows(data: SFTDataConfig) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows): the task's (`num_examples` seeded rows), or the file's
    (`data.path`, split as `baton train` splits it: `baton.trainers.session.state.task_rows`)."""
    task = configured_task(data.task, data.task_args)
    if not data.path:
        return task.train_rows(data.num_examples, seed=data.seed), task.eval_rows(data.eval_size)
    train, held = task_rows(DataConfig(task=data.task, task_args=data.task_args, path=data.path,
                                       eval_path=data.eval_path, eval_size=max(data.eval_size, 1), seed=data.seed),
                            data.TARGET_FIELD)
    return train[:data.num_examples], held[:data.eval_size]


def target_of(task, row: dict) -> str:
    """What SFT teaches for `row`: its own `target` field, else the task's reference completion."""
    return str(row["target"]) if row.get("target") is not None else task.target(row)


def encode_examples(tokenizer, task, rows: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + target + EOS ids, prompt length) per row (chat-message prompts rendered
    with the tokenizer's template, `baton.data.records.render_prompt`)."""
    prompts = tokenizer([render_prompt(tokenizer, r["prompt"]) for r in rows], add_special_tokens=False)["input_ids"]
    targets = tokenizer([target_of(task, r) for r in rows], add_special_tokens=False)["input_ids"]
    return [(p + t + [tokenizer.eos_token_id], len(p)) for p, t in zip(prompts, targets)]


def collate_examples(examples: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and labels (IGNORE on prompt and padding)."""
    input_ids, mask = pad_right([ids for ids, _ in examples], pad_id)  # [B, T], [B, T]
    labels, _ = pad_right([[IGNORE] * plen + ids[plen:] for ids, plen in examples], IGNORE)  # [B, T]
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def completion_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the completion tokens given everything before them."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, T, V]
    return functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(),
                                    ignore_index=IGNORE)


def evaluate_model(model, tokenizer, task, rows: list[dict], samples: int, seed: int = 0) -> dict[str, float]:
    """Held-out metrics on `rows` (`baton.envs.evaluate.evaluate_modes`: greedy, and `samples`
    per prompt at T=1) through the embedded rollout engine."""
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine  # lazy: only evaluation needs it

    return evaluate_modes(build_engine(DEFAULT_ENGINE, model, tokenizer), tokenizer, task, rows, n=samples, seed=seed)


def held_out_samples(model, tokenizer, task, rows: list[dict], step: int, k: int = 8) -> list[dict[str, Any]]:
    """samples.jsonl's lines for an SFT evaluation: the greedy completions of the first `k`
    held-out rows, each with its reward (1.0 when the task's verifier accepts it and the
    model stopped), as the RL drivers write theirs."""
    from baton.protocol import SamplingParams
    from baton.rollout.engines import DEFAULT_ENGINE, build_engine

    rows = rows[:k]
    prompts = [tokenizer(render_prompt(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in rows]
    done = build_engine(DEFAULT_ENGINE, model, tokenizer).generate(prompts, SamplingParams(temperature=0.0,
                                                                                          max_new_tokens=16))
    out = []
    for c in done:
        row, text = rows[c.prompt_index], tokenizer.decode(c.token_ids, skip_special_tokens=True)
        ok = c.finish_reason == "stop" and task.is_correct(text, row)
        out.append({"step": step, "prompt": row["prompt"], "completion": text, "reward": float(ok),
                    **({"answer": str(row["answer"])} if row.get("answer") is not None else {})})
    return out


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    t, o = cfg.trainer, cfg.optim
    with RunSession(cfg) as run:
        task = get_task(cfg.data.task)
        model, tokenizer = build_model_and_tokenizer(cfg.model)
        model = place(model, t)  # trainer.device (auto: the GPU when there is one)
        train_rows, eval_rows = sft_rows(cfg.data)
        examples = encode_examples(tokenizer, task, train_rows)
        state = RunState(sampler=PromptSampler(examples, seed=cfg.data.seed), eval_rows=[])
        optim, sched = o.build(model, t.steps, no_decay_1d=True, fused=o.fused)
        print(f"sft: {count_params(model) / 1e6:.2f}M params, {len(examples)} examples, "
              f"{t.steps} steps x {t.batch_size}")

        def loss_fn(model, rows) -> tuple[torch.Tensor, dict[str, float]]:
            batch = collate_examples(rows, tokenizer.pad_token_id)
            return completion_loss(model, {k: v.to(model.device) for k, v in batch.items()}), {}

        samples = SampleLog(run.path, t.eval_every, t.steps)

        def evaluate() -> dict[str, float]:  # at step 0, every trainer.eval_every steps and the last
            samples.write_records(state.step, held_out_samples(model, tokenizer, task, eval_rows, state.step))
            return evaluate_model(model, tokenizer, task, eval_rows, cfg.data.eval_samples, seed=t.seed)

        result = fit(run, o.grad_clip, model, tokenizer, optim, sched, state, loss_fn,
                     evaluate if eval_rows else None, prefix="sft", evaluate_at_start=True)
    result["params"] = count_params(model)
    if "eval/accuracy_greedy" in result:
        print(f"sft held-out accuracy ({len(eval_rows)} prompts): greedy {result['eval/accuracy_greedy']:.3f}  "
              f"sampled T=1 {result['eval/accuracy_sampled']:.3f}")
    return result
