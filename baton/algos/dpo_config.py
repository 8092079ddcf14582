"""The `dpo:` section of a recipe: which preference loss, how strong, how pairs are made,
and whether / how often the reference follows the policy.

Read by the DPO actor (loss, beta, label_smoothing, ipo_length_norm, reference_free), by the
online driver (pairing, min_margin, ref_refresh_every) and by the offline driver (the loss
keys). Names are checked against `DPO_LOSSES` / `PAIRINGS` and every range in `check()`,
which the run configs call from `__post_init__`, so a bad recipe fails before any model loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.algos.dpo import DPO_LOSSES
from baton.algos.pairs import PAIRINGS


@dataclass
class DPOLossConfig:
    beta: float = 0.1  # strength of the implicit KL to the reference (sigmoid/hinge: scale of h)
    loss: str = "sigmoid"  # a name in baton.algos.DPO_LOSSES: sigmoid | ipo | hinge
    label_smoothing: float = 0.0  # sigmoid only: conservative DPO's assumed label-flip rate, [0, 0.5)
    # ipo only. True (the default): each log-ratio is divided by its response length, as
    # TRL does and as the IPO authors' results use; False: the paper's eq. 17 on token sums,
    # where long pairs dominate and beta's meaning changes with the length (see baton.algos.dpo).
    ipo_length_norm: bool = True
    reference_free: bool = False  # no reference role: log ref = 0 in every log-ratio
    # RPO (baton.algos.rpo): + nll_coef * per-token NLL of the chosen response (TRL: rpo_alpha)
    nll_coef: float = 0.0
    pairing: str = "best_worst"  # online: a name in baton.algos.PAIRINGS: best_worst | all
    min_margin: float = 0.0  # online: a pair's score difference must exceed this (ties never pair)
    ref_refresh_every: int = 0  # online: copy the policy into the reference every K steps (0 = frozen)

    def check(self) -> None:
        if self.loss not in DPO_LOSSES:
            raise ValueError(f"dpo.loss={self.loss!r} is not one of {sorted(DPO_LOSSES)}")
        if self.pairing not in PAIRINGS:
            raise ValueError(f"dpo.pairing={self.pairing!r} is not one of {sorted(PAIRINGS)}")
        if not self.beta > 0:
            raise ValueError(f"dpo.beta must be > 0, got {self.beta}")
        if not 0.0 <= self.label_smoothing < 0.5:
            raise ValueError(f"dpo.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if self.label_smoothing and self.loss != "sigmoid":
            raise ValueError(f"dpo.label_smoothing applies to loss=sigmoid only (loss={self.loss!r})")
        if self.nll_coef < 0:
            raise ValueError(f"dpo.nll_coef must be >= 0, got {self.nll_coef}")
        if self.min_margin < 0:
            raise ValueError(f"dpo.min_margin must be >= 0, got {self.min_margin}")
        if self.ref_refresh_every < 0:
            raise ValueError(f"dpo.ref_refresh_every must be >= 0, got {self.ref_refresh_every}")
        if self.reference_free and self.ref_refresh_every:
            raise ValueError("dpo.ref_refresh_every needs a reference: it cannot be set with "
                             "dpo.reference_free=true")

    def loss_kwargs(self) -> dict[str, Any]:
        """The loss-specific arguments of `baton.algos.dpo_loss` for `self.loss`."""
        return {"sigmoid": {"label_smoothing": self.label_smoothing},
                "ipo": {"length_norm": self.ipo_length_norm}}.get(self.loss, {})
