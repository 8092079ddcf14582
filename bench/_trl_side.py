"""The TRL half of `bench/grpo_vs_trl.py`: run `trl.GRPOTrainer` and return per-step records.

Kept apart so the benchmark's TRL-specific knobs (whose names TRL renames often) live in one
place. Every setting that differs from a TRL default is there to match baton's GRPO step:
no KL, clip 0.2/0.28, token-mean loss over the batch ("dapo"), group-std advantages,
AdamW betas (0.9, 0.99), constant LR with no warm-up, grad clip 1.0, fp32, no gradient
checkpointing, one generation batch -> one optimizer step, and the prompts in the order
baton's sampler draws them (TRL's own shuffling off).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local directories only, never the hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def trl_reward(name: str, fn: Callable[..., float], columns: list[str],
               seen: list[list[str]] | None = None) -> Callable[..., list[float]]:
    """Wrap a baton reward `fn(prompt, completion, **row) -> float` as a TRL reward function.

    TRL calls `f(prompts, completions, **kwargs)` with each dataset column as a list in kwargs
    (plus its own extras - trainer_state, completion_ids, log_metric ... - which we drop).
    `seen`, if given, collects the prompts of each call (to check the data order).
    """

    def reward(prompts: list, completions: list, **kwargs: Any) -> list[float]:
        if seen is not None:
            seen.append(list(prompts))
        # a conversational dataset (chat-message prompts): TRL passes each completion as
        # [{"role": "assistant", "content": text}]; baton's reward functions read the text
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(fn(p, c, **{k: kwargs[k][i] for k in columns}))
                for i, (p, c) in enumerate(zip(prompts, texts))]

    reward.__name__ = name.replace("/", "_")  # TRL logs rewards/<__name__>/mean
    return reward


def _timed_trainer_cls():
    """A GRPOTrainer subclass that clocks its generation, reward and generate+score phases."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        phase_times: dict[str, float]

        def _clock(self, phase: str, method, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                times = self.__dict__.setdefault("phase_times", {})
                times[phase] = times.get(phase, 0.0) + time.perf_counter() - t0

        def _generate(self, prompts):  # tokenize + model.generate (+ decode)
            return self._clock("rollout", super()._generate, prompts)

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            return self._clock("reward", super()._calculate_rewards, inputs, prompts, completions,
                               completion_ids_list)

        def _generate_and_score_completions(self, inputs):  # rollout + reward + advantages
            return self._clock("gen_score", super()._generate_and_score_completions, inputs)

    return TimedGRPOTrainer


def run_trl(model_dir: str, step_rows: list[list[dict[str, Any]]], *, G: int, max_new_tokens: int,
            lr: float, reward_weights: dict[str, float], seed: int = 0,
            clip_low: float = 0.2, clip_high: float = 0.28, device: str = "cpu") -> list[dict[str, float]]:
    """Train `len(step_rows)` GRPO steps with TRL; step k uses the prompts `step_rows[k]`;
    `device` "cuda": on the GPU in bf16 autocast (fp32 master weights), "cpu": fp32.

    Returns one record per step: `step_s`, `rollout_s`, `reward_s`, `update_s`, `other_s`,
    `tokens` (completion tokens generated), `reward` (TRL's logged mean reward).
    """
    import dataclasses

    import datasets
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig

    from baton.envs import TASKS  # noqa: F401 - importing registers the task reward functions
    from baton.models.load import load_model, load_tokenizer
    from baton.rewards.runner import REWARD_FUNCTIONS

    steps, prompts_per_step = len(step_rows), len(step_rows[0])
    rows = [r for step in step_rows for r in step]
    columns = sorted(set(rows[0]) - {"prompt"})
    names = list(reward_weights)
    seen: list[list[str]] = []  # prompts of each reward call (only the first function records)
    funcs = [trl_reward(n, REWARD_FUNCTIONS[n], columns, seen if i == 0 else None) for i, n in enumerate(names)]

    records: list[dict[str, float]] = []

    class StepClock(TrainerCallback):
        """Wall time of each optimizer step (generation included), and what TRL logs for it."""

        def on_step_begin(self, args, state, control, **kw):
            trainer.phase_times = {}
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            ph = dict(trainer.phase_times)
            gen_score = ph.get("gen_score", 0.0)
            records.append({"step_s": step_s, "rollout_s": ph.get("rollout", 0.0),
                            "reward_s": ph.get("reward", 0.0), "update_s": step_s - gen_score,
                            "other_s": gen_score - ph.get("rollout", 0.0) - ph.get("reward", 0.0)})

        def on_log(self, args, state, control, logs=None, **kw):
            # With logging_steps=1 each train log belongs to the step that just ended.
            if logs and "reward" in logs and records and "reward" not in records[-1]:
                records[-1]["reward"] = float(logs["reward"])
                records[-1]["tokens"] = float(logs["completions/mean_length"]) * prompts_per_step * G

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    ckpt_flag = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    with tempfile.TemporaryDirectory(prefix="trl-grpo-") as out_dir:
        args = GRPOConfig(
            # cuda: TRL's own generate on the GPU, bf16 autocast with fp32 master weights (as baton's actor.bf16)
            output_dir=out_dir, use_cpu=device == "cpu", bf16=device == "cuda", fp16=False, seed=seed,
            per_device_train_batch_size=prompts_per_step * G, gradient_accumulation_steps=1,
            steps_per_generation=1, num_iterations=1, num_generations=G,
            max_completion_length=max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
            max_steps=steps, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
            adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.0, max_grad_norm=1.0,
            beta=0.0, epsilon=clip_low, epsilon_high=clip_high, loss_type="dapo",
            scale_rewards="group", reward_weights=[reward_weights[n] for n in names],
            shuffle_dataset=False, logging_steps=1, report_to=[],
            save_strategy="no", log_completions=False, disable_tqdm=True, dataloader_num_workers=0,
            # TRL turns activation checkpointing on by default; baton does not use it.
            # (transformers 5 renamed gradient_checkpointing to activation_checkpointing.)
            **{ckpt_flag: False},
        )
        tok = load_tokenizer(model_dir)
        trainer = _timed_trainer_cls()(
            model=load_model(model_dir).train(), reward_funcs=funcs, args=args,
            train_dataset=datasets.Dataset.from_list(rows), processing_class=tok,
            callbacks=[StepClock()],
        )
        model_ckpt = getattr(trainer.model, "is_activation_checkpointing", None)
        if model_ckpt is None:  # transformers < 5 names it after gradients
            model_ckpt = trainer.model.is_gradient_checkpointing
        if args.gradient_checkpointing or model_ckpt:
            raise RuntimeError("gradient checkpointing is on in TRL; the comparison would be unfair")
        trainer.remove_callback(PrinterCallback)  # it prints every step's log dict
        trainer.train()
    if len(records) != steps:
        raise RuntimeError(f"TRL ran {len(records)} steps, expected {steps}")
    # Same prompts per step as baton, G samples each (TRL's order within a step may differ).
    key = json.dumps  # a prompt is a string or a list of chat messages
    got = [sorted(map(key, p)) for p in seen]
    want = [sorted(key(r["prompt"]) for r in step for _ in range(G)) for step in step_rows]
    if got != want:
        raise RuntimeError("TRL did not see the prompts in the order given (check shuffle_dataset)")
    return records
