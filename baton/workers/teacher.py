"""The teacher role of on-policy distillation (`algo.advantage: distill`, a `teacher:` section).

Consumes the student's rows (prompt/response ids); produces teacher_logprobs [B, R]: the
frozen teacher's logprobs of the tokens the student sampled, in fp32 (logits upcast before
the softmax), at the rollout temperature, as the reference computes its own: it IS the
reference worker (`ReferenceWorker.frozen_logprobs`) loaded from `teacher.path`. Agents'
observation tokens are scored too (they are context) and masked by the estimator.

With `algo.distill_loss` other than "advantage" it also keeps, at every response position, its
K most likely tokens and their logprobs (teacher_topk_ids / teacher_topk_logprobs [B, R, K],
K = `algo.distill_topk`, 0 = the whole vocabulary), from the full logits: the student's
divergence to them is the actor's loss term (baton.algos.distill).

Placement is the reference's: colocated in the actor's process by default, or on a pool of its
own with `placement.roles.teacher=POOL` (on Ray, a worker or several of its own, on a GPU of
its own where `placement.gpus_per_worker` gives one).

The teacher scores the student's token ids, so both must share one vocabulary:
`check_vocabulary` compares the two tokenizers before anything loads or is written (a
ConfigError, one line, naming both). One tokenizer, more embedding rows (a padded embedding:
Qwen2.5-7B has 152,064 rows, 0.5B 151,936): the teacher's output rows past the student's
(`vocab_size`) are dropped as it loads, so its distribution is renormalised over the
student's vocabulary (`fit`), said in one line.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, register
from baton.models.config import ModelConfig, check_model_path
from baton.models.precision import autocast
from baton.workers.reference import ReferenceWorker
from baton.workers.sequences import batched_topk

log = logging.getLogger(__name__)


def vocab_rows(path: str) -> int | None:
    """The model at `path`'s embedding rows (its config.json's `vocab_size`; None if unknown)."""
    try:
        rows = json.loads((Path(path) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return rows if isinstance(rows, int) and rows > 0 else None


@dataclass
class TeacherConfig:
    path: str = ""  # a local HF causal LM with the student's tokenizer (e.g. checkpoints/arith-grpo)
    bf16: bool | None = None  # compute in bf16 (logprobs in fp32); null: on CUDA yes, on the CPU no

    def check(self) -> None:
        if not self.path:
            raise ValueError("teacher.path is required: the local HF model whose logprobs the student learns from")

    def check_files(self, student: str, topk: int = 0) -> None:
        """The teacher's directory exists and its vocabulary is the student's (`student`:
        model.path), and `topk` (algo.distill_topk; 0: all) is within it; a ConfigError otherwise."""
        from baton.config import ConfigError

        check_model_path(self.path, "teacher.path")
        check_vocabulary(self.path, student)
        rows = vocab_rows(student)
        if topk and rows is not None and topk > rows:
            raise ConfigError(f"algo.distill_topk={topk} is more than the vocabulary of model.path={student} "
                              f"({rows} tokens): give at most {rows}, or 0 for the whole vocabulary")


def check_vocabulary(teacher: str, student: str) -> None:
    """ConfigError (one line) unless the tokenizers at `teacher` and `student` map the same
    tokens to the same ids (the teacher scores the student's ids; no mapping between
    vocabularies is attempted)."""
    from baton.config import ConfigError
    from baton.models.load import load_tokenizer

    t_vocab, s_vocab = load_tokenizer(teacher).get_vocab(), load_tokenizer(student).get_vocab()
    if t_vocab == s_vocab:
        return
    differ = sorted(set(t_vocab.items()) ^ set(s_vocab.items()), key=lambda kv: kv[1])
    token, _ = differ[0]
    raise ConfigError(f"teacher.path={teacher} ({len(t_vocab)} tokens) and model.path={student} ({len(s_vocab)} tokens) "
                      f"have different vocabularies (first difference: {token!r} is id {t_vocab.get(token)} vs "
                      f"{s_vocab.get(token)}): the teacher scores the student's token ids, so both need one tokenizer")


class TeacherWorker(ReferenceWorker):
    """`TeacherWorker(teacher, temperature=, micro_batch_size=, strategy=)`: the reference's
    machinery on `teacher.path`, in `teacher.bf16`'s precision."""

    def __init__(self, teacher: TeacherConfig, *, temperature: float, micro_batch_size: int,
                 strategy: str = "ddp", topk: int | None = None, vocab_size: int | None = None):
        self.vocab_size, self.path = vocab_size, teacher.path  # the student's rows (`fit`)
        super().__init__(ModelConfig(path=teacher.path), temperature=temperature,
                         micro_batch_size=micro_batch_size, strategy=strategy, bf16=teacher.bf16)
        self.topk = topk  # None: the sampled tokens' logprobs only; K (0: all) with algo.distill_loss

    def fit(self, model: Any) -> Any:
        """Drop the teacher's output rows past the student's `vocab_size` (a padded embedding):
        its logits there are never the student's tokens; the softmax renormalises over the rest."""
        rows = model.get_input_embeddings().weight.shape[0]
        if self.vocab_size is not None and rows > self.vocab_size:
            log.warning("teacher.path=%s has %d embedding rows, the student %d: the teacher's logits past "
                        "the student's vocabulary are dropped (its distribution renormalised over the rest)",
                        self.path, rows, self.vocab_size)
            model.resize_token_embeddings(self.vocab_size)
        return model

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        if self.topk is None:
            return Batch({F.TEACHER_LOGPROBS: self.frozen_logprobs(batch)})
        with autocast(self.device, self.bf16):
            out = batched_topk(self.model, batch, self.micro_batch_size, self.temperature, self.topk)
        return Batch({F.TEACHER_LOGPROBS: out["logprobs"], F.TEACHER_TOPK_IDS: out["topk_ids"],
                      F.TEACHER_TOPK_LOGPROBS: out["topk_logprobs"]})
