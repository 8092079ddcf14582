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
ConfigError, one line, naming both).
"""

from __future__ import annotations

from dataclasses import dataclass

from baton import fields as F
from baton.batch import Batch
from baton.controller import Dispatch, register
from baton.models.config import ModelConfig, check_model_path
from baton.models.precision import autocast
from baton.workers.reference import ReferenceWorker
from baton.workers.sequences import batched_topk


@dataclass
class TeacherConfig:
    path: str = ""  # a local HF causal LM with the student's tokenizer (e.g. checkpoints/arith-grpo)
    bf16: bool | None = None  # compute in bf16 (logprobs in fp32); null: on CUDA yes, on the CPU no

    def check(self) -> None:
        if not self.path:
            raise ValueError("teacher.path is required: the local HF model whose logprobs the student learns from")

    def check_files(self, student: str) -> None:
        """The teacher's directory exists and its vocabulary is the student's (`student`:
        model.path); a ConfigError otherwise."""
        check_model_path(self.path, "teacher.path")
        check_vocabulary(self.path, student)


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
                 strategy: str = "ddp", topk: int | None = None):
        super().__init__(ModelConfig(path=teacher.path), temperature=temperature,
                         micro_batch_size=micro_batch_size, strategy=strategy, bf16=teacher.bf16)
        self.topk = topk  # None: the sampled tokens' logprobs only; K (0: all) with algo.distill_loss

    @register(dispatch=Dispatch.DP_COMPUTE, blocking=False)  # returns a future
    def compute_teacher_logprobs(self, batch: Batch) -> Batch:
        if self.topk is None:
            return Batch({F.TEACHER_LOGPROBS: self.frozen_logprobs(batch)})
        with autocast(self.device, self.bf16):
            out = batched_topk(self.model, batch, self.micro_batch_size, self.temperature, self.topk)
        return Batch({F.TEACHER_LOGPROBS: out["logprobs"], F.TEACHER_TOPK_IDS: out["topk_ids"],
                      F.TEACHER_TOPK_LOGPROBS: out["topk_logprobs"]})
