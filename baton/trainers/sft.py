"""Supervised warm start: teach a (tiny) model a task's answer format before GRPO.

The loss is next-token cross-entropy on the completion tokens only (target + EOS); the
prompt tokens are context, not targets. Batches come from `PromptSampler`, so the data order
is a function of the seed. At the end the model is saved atomically as an HF checkpoint
(model + tokenizer) and its held-out accuracy is printed, greedy and sampled.

    cfg = SFTConfig(model=ModelSection(preset="0.75m"), trainer=TrainerSection(steps=5))
    result = run_sft(cfg)  # {"loss_first": ..., "loss_last": ..., "eval/accuracy_greedy": ...}
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from baton.data.prompts import PromptSampler
from baton.workers.optim import lr_factor
from baton.envs import get_task
from baton.envs.evaluate import evaluate
from baton.models import build_char_tokenizer, build_tiny_model, count_params, load_model, load_tokenizer, save_pretrained

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


@dataclass
class TrainerSection:
    steps: int = 180
    batch_size: int = 64
    seed: int = 0  # torch seed (dropout-free models: only matters for sampling in eval)
    log_every: int = 50
    num_threads: int = 1  # torch intra-op threads (0 leaves torch's default); 1 is faster on a shared box
    run_dir: str | None = "runs/sft"  # metrics.jsonl + config.json go here (None: nowhere)
    save_path: str | None = "checkpoints/arith-sft"  # HF checkpoint (None: do not save)
    save_dtype: Literal["float32", "bfloat16"] = "float32"


@dataclass
class SFTConfig:
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
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # [B, T]
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)  # [B, T]
    mask = torch.zeros((len(examples), width), dtype=torch.long)  # [B, T]
    for i, (ids, plen) in enumerate(examples):
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, plen:len(ids)] = torch.tensor(ids[plen:])
        mask[i, :len(ids)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def completion_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean cross-entropy of the completion tokens given everything before them."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, T, V]
    return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), batch["labels"][:, 1:].flatten(), ignore_index=IGNORE)


def lr_at(step: int, cfg: OptimSection, total: int) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr (the schedule the actor uses)."""
    return cfg.lr * lr_factor(step, warmup_steps=cfg.warmup_steps, total_steps=total,
                              schedule="cosine", min_ratio=cfg.min_lr_ratio)


def evaluate_model(model, tokenizer, task, eval_size: int, samples: int, seed: int = 0) -> dict[str, float]:
    """Held-out accuracy, greedy and sampled at T=1, through the embedded rollout engine."""
    from baton.rollout.engine import EmbeddedEngine  # lazy: only evaluation needs it

    rows = task.eval_rows(eval_size)
    engine = EmbeddedEngine(model, tokenizer)
    was_training = model.training
    model.eval()
    try:
        greedy = evaluate(engine, tokenizer, task, rows, greedy=True, seed=seed)
        sampled = evaluate(engine, tokenizer, task, rows, greedy=False, n=samples, seed=seed)
    finally:
        model.train(was_training)
    return {"eval/accuracy_greedy": greedy["accuracy"], "eval/accuracy_sampled": sampled["accuracy"],
            "eval/stop_rate_sampled": sampled["stop_rate"]}


def run_sft(cfg: SFTConfig) -> dict[str, Any]:
    t0 = time.perf_counter()
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    torch.manual_seed(cfg.trainer.seed)
    task = get_task(cfg.data.task)
    model, tokenizer = build_model_and_tokenizer(cfg.model)
    examples = encode_examples(tokenizer, task, task.train_rows(cfg.data.num_examples, seed=cfg.data.seed))
    sampler = PromptSampler(examples, seed=cfg.data.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]  # no decay on norms/biases
    rest = [p for n, p in model.named_parameters() if p.ndim < 2]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.optim.weight_decay},
                               {"params": rest, "weight_decay": 0.0}], lr=cfg.optim.lr, betas=cfg.optim.betas)
    run_dir = Path(cfg.trainer.run_dir) if cfg.trainer.run_dir else None
    if run_dir:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=2))
    log = open(run_dir / "metrics.jsonl", "w") if run_dir else None
    print(f"sft: {count_params(model) / 1e6:.2f}M params, {len(examples)} examples, "
          f"{cfg.trainer.steps} steps x {cfg.trainer.batch_size}")

    model.train()
    losses: list[float] = []
    window: list[float] = []
    try:
        for step in range(cfg.trainer.steps):
            for group in optim.param_groups:
                group["lr"] = lr_at(step, cfg.optim, cfg.trainer.steps)
            batch = collate_examples(sampler.next_batch(cfg.trainer.batch_size), tokenizer.pad_token_id)
            loss = completion_loss(model, batch)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            optim.step()
            losses.append(loss.item())
            window.append(losses[-1])
            last = step == cfg.trainer.steps - 1
            if (step + 1) % cfg.trainer.log_every == 0 or last or step == 0:
                rec = {"step": step + 1, "loss": sum(window) / len(window), "lr": optim.param_groups[0]["lr"],
                       "grad_norm": float(grad_norm), "time_s": round(time.perf_counter() - t0, 2)}
                print(f"sft step {rec['step']:>5}  loss {rec['loss']:.4f}  lr {rec['lr']:.2e}  "
                      f"grad_norm {rec['grad_norm']:.2f}  {rec['time_s']:.1f}s", flush=True)
                if log:
                    log.write(json.dumps(rec) + "\n")
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
