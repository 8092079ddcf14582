"""The engine protocol, re-exported for the engine implementations in this package.

The types live in `baton.protocol`, below both `baton.rollout` (which implements engines)
and `baton.sync` (which moves weights into them), so neither has to import the other.
"""

from baton.protocol import GRAMMAR_ERROR, Completion, Engine, SamplingParams

__all__ = ["GRAMMAR_ERROR", "Completion", "Engine", "SamplingParams"]
