"""Supervised warm start: teach a (tiny) model a task's answer format before GRPO.

The loss is next-token cross-entropy on the completion tokens only (target + EOS); the
prompt tokens are context, not targets. Batches come from `PromptSampler`, so the data order
is a function of the seed. The run dir gets what a GRPO run's gets from the same pieces:
config.yaml (`save_config`, atomic) and metrics.jsonl (`MetricsLogger`); the optimizer and
its schedule come from `build_optimizer`, the held-out evaluation from `evaluate_modes`. At
the end the model is saved atomically as an HF checkpoint (model + tokenizer) and its
held-out accuracy is printed, greedy and sampled.

    cfg = SFTConfig(model=ModelSection(preset="0.75m"), trainer=TrainerSection(steps=5))
    result = run_sft(cfg)  # {"loss_first": ..., "loss_last": ..., "eval/accuracy_greedy": ...}
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from baton.config import save_config
from baton.data.prompts import PromptSampler
from baton.envs import get_task
from baton.envs.evaluate import evaluate_modes
from baton.metrics import MetricsLogger
from baton.models import build_char_tokenizer, build_tiny_model, count_params, load_model, load_tokenizer, save_pretrained
from baton.padding import pad_right
from baton.workers.optim import build_optimizer

IGNORE = -100  # label of tokens that carry no loss (prompt, padding)


@dataclass
class ModelSection:
    path: str | None = None  # a local HF dir to start from; None builds a tiny model
    preset: str = "0.75m"  # baton.models.tiny.PRESETS key, used when path is None
    family: Literal["qwen2", "llama"] = "qwen2"
    overrides: dict[str, int] = field(default_factory=dict)  # tiny_config args, e.g. {layers: 2}
    seed: int = 0  # init seed of a fresh tiny model


@dataclass
class DataSection:
    task: str = "arithmetic"  # a name in baton.envs.TASKS
    num_examples: int = 20_000
    seed: int = 0  # which training rows, and their order
    eval_size: int = 200  # held-out prompts for the final evaluation (0 skips it)
    eval_samples: int = 4  # samples per held-out prompt for the sampled (T=1) accuracy


@dataclass
class OptimSection:
    lr: float = 3e-3
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1  # cosine decay floor, as a fraction of lr
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    # PyTorch's default AdamW, not the fused kernel the actor uses: their last bits differ, and
    # over 180 steps that changes the weights; unfused reproduces checkpoints/arith-sft exactly.
    fused: bool = False


@dataclass
class TrainerSection:
    steps: int = 180
    batch_size: int = 64
    seed: int = 0  # torch seed (dropout-free models: only matters for sampling in eval)
    log_every: int = 50
    num_threads: int = 1  # torch intra-op threads (0 leaves torch's default); 1 is faster on a shared box
    run_dir: str | None = "runs/sft"  # metrics.jsonl + config.yaml go here (None: nowhere)
    save_path: str | None = "checkpoints/arith-sft"  # HF checkpoint (None: do not save)
    save_dtype: Literal["float32", "bfloat16"] = "float32"


@dataclass
class SFTConfig:
    algorithm: Literal["sft"] = "sft"
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)


def build_model_and_tokenizer(cfg: ModelSection):
    if cfg.path is not None:
        return load_model(cfg.path).train(), load_tokenizer(cfg.path)
    tok = build_char_tokenizer()
    model = build_tiny_model(cfg.preset, family=cfg.family, vocab_size=len(tok), seed=cfg.seed, **cfg.overrides)
    return model.train(), tok


def encode_examples(tokenizer, task, rows: list[dict]) -> list[tuple[list[int], int]]:
    """(prompt + target + EOS ids, prompt length) per row."""
    prompts = tokenizer([r["prompt"] for r in rows], add_special_tokens=False)["input_ids"]
    targets = tokenizer([task.target(r) for r in rows], add_special_tokens=False)["input_ids"]
    return [(p + t + [tokenizer.eos_token_id], len(p)) for p, t in zip(prompts, targets)]


def collate_examples(examples: list[tuple[list[int], int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ids, attention mask and labels (IGNORE on prompt and padding)."""
    input_ids, mask = pad_right([ids for ids, _ in examples], pad_id)  # [B, T], [B, T]
    labels, _ = pad_right([[IGNORE] * plen + ids[plen:] for ids, plen in examples], IGNORE)  # [B, T]
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def completion_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the completion tokens given everything before them."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, T, V]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE)


def evaluate_model(model, tokenizer, task, eval_size: int, samples: int, seed: int = 0) -> dict[str, float]:
    """Held-out metrics (`baton.envs.evaluate.evaluate_modes`: greedy, and `samples` per
    prompt at T=1) through the embedded rollout engine."""
    from baton.rollout.engine import EmbeddedEngine  # lazy: only evaluation needs it

    was_training = model.training
    model.eval()
    try:
        return evaluate_modes(EmbeddedEngine(model, tokenizer), tokenizer, task, task.eval_rows(eval_size),
                              n=samples, seed=seed)
    finally:
        model.train(was_training)


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(cfg.trainer.seed)
    task = get_task(cfg.data.task)
    model, tokenizer = build_model_and_tokenizer(cfg.model)
    examples = encode_examples(tokenizer, task, task.train_rows(cfg.data.num_examples, seed=cfg.data.seed))
    sampler = PromptSampler(examples, seed=cfg.data.seed)
    o = cfg.optim
    optim, sched = build_optimizer(model, lr=o.lr, weight_decay=o.weight_decay, betas=o.betas,
                                   warmup_steps=o.warmup_steps, total_steps=cfg.trainer.steps, schedule="cosine",
                                   min_ratio=o.min_lr_ratio, no_decay_1d=True, fused=o.fused)
    log = None
    if cfg.trainer.run_dir:
        save_config(cfg, Path(cfg.trainer.run_dir) / "config.yaml")  # creates the run dir
        log = MetricsLogger(cfg.trainer.run_dir, cfg.trainer.steps, console=False)
    print(f"sft: {count_params(model) / 1e6:.2f}M params, {len(examples)} examples, "
          f"{cfg.trainer.steps} steps x {cfg.trainer.batch_size}")

    model.train()
    losses: list[float] = []
    window: list[float] = []
    try:
        for step in range(cfg.trainer.steps):
            lr = optim.param_groups[0]["lr"]  # this step's (the schedule moves after the step)
            batch = collate_examples(sampler.next_batch(cfg.trainer.batch_size), tokenizer.pad_token_id)
            loss = completion_loss(model, batch)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            optim.step()
            sched.step()
            losses.append(loss.item())
            window.append(losses[-1])
            last = step == cfg.trainer.steps - 1
            if (step + 1) % cfg.trainer.log_every == 0 or last or step == 0:
                rec = {"loss": sum(window) / len(window), "lr": lr, "grad_norm": float(grad_norm),
                       "time_s": round(time.perf_counter() - t0, 2)}
                print(f"sft step {step + 1:>5}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                      f"grad_norm {rec['grad_norm']:.2f}  {rec['time_s']:.1f}s", flush=True)
                if log:
                    log.log(step + 1, rec)
                window = []
    finally:
        if log:
            log.close()

    train_s = time.perf_counter() - t0
    result: dict[str, Any] = {"loss_first": losses[0], "loss_last": losses[-1], "losses": losses,
                              "train_s": train_s, "params": count_params(model)}
    if cfg.data.eval_size > 0:
        result.update(evaluate_model(model, tokenizer, task, cfg.data.eval_size, cfg.data.eval_samples,
                                     seed=cfg.trainer.seed))
        print(f"sft held-out accuracy ({cfg.data.eval_size} prompts): greedy {result['eval/accuracy_greedy']:.3f}  "
              f"sampled T=1 {result['eval/accuracy_sampled']:.3f}")
    if cfg.trainer.save_path:
        model.eval()
        if cfg.trainer.save_dtype == "bfloat16":
            model = model.to(torch.bfloat16)
        result["save_path"] = str(save_pretrained(model, tokenizer, cfg.trainer.save_path))
        print(f"sft: saved {result['save_path']}")
    result["time_s"] = time.perf_counter() - t0
    return result
