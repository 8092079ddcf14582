"""The algorithm families' registries (advantages, policy losses, KL estimators, loss
aggregations, ...) are `baton.registry.Registry`s; a new variant is one decorated function
in any module that is imported before the trainer looks the name up:

    @register_advantage("my_adv", inputs=("scores", "response_mask", "group_index"))
    def my_adv(*, scores, response_mask, ...): ...
"""

from __future__ import annotations

from baton.registry import Registry, UnknownName

__all__ = ["Registry", "UnknownName"]
