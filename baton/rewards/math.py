"""Math answer verification: numeric normalisation first, then `math-verify` (optional dep).

    math_equal("The total is $1,234.", "1234")  -> True
    reward "math/correct"(prompt, completion, answer=...)  -> 1.0 / 0.0

The answer of a completion is, in order: the text after the last `####` (GSM8K's format),
the last `\\boxed{...}`, else the last number in the text. Numbers are normalised before
comparing (`18`, `18.0`, `$18`, `1,234`, `18.`, `18%` are numbers), so the common GSM8K case
needs no symbolic maths. Anything else (fractions, LaTeX, expressions) goes to `math-verify`
(`pip install math-verify`), called with its own signal-based timeouts switched off
(`parsing_timeout=None, timeout_seconds=None`): those use SIGALRM, which fails outside the
main thread. The deadline is the caller's: run `math/correct` through
`baton.rewards.runner.RewardRunner` (sandbox="process"), whose per-call deadline SIGKILLs a stuck
worker process and counts the call as a timeout (GSM8K's environment does).
"""

from __future__ import annotations

import logging
import re
from decimal import Decimal, InvalidOperation

from baton.rewards.registry import register_reward

_NUMBER = re.compile(r"-?\$?\s?\d[\d,]*(?:\.\d+)?|-?\$?\s?\.\d+")
_BOXED = "\\boxed{"


def gsm8k_gold(answer: str) -> str:
    """The final answer of a GSM8K `answer` field (the text after `####`), else the field."""
    return answer.rsplit("####", 1)[1].strip() if "####" in answer else answer.strip()


def _last_boxed(text: str) -> str | None:
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(completion: str) -> str | None:
    """The answer a completion gives (see the module docstring), or None if it gives none."""
    text = completion.split("<eos>", 1)[0]
    if "####" in text:
        tail = text.rsplit("####", 1)[1].strip()
        return tail.splitlines()[0].strip() if tail else None
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def normalize_number(text: str) -> Decimal | None:
    """`18`, `18.0`, `$18`, `1,234`, ` 18. `, `18%`, `-3` -> a Decimal; None if not a plain number."""
    s = text.strip().rstrip(".").replace("$", "").replace(",", "").replace(" ", "")
    s = s.removesuffix("%").removeprefix("\\$")
    if not s or not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)", s):
        return None
    try:
        return Decimal(s)
    except InvalidOperation:
        return None


def math_equal(completion_answer: str | None, gold: str, use_math_verify: bool = True) -> bool:
    """Whether an extracted answer equals the gold answer (numbers compared exactly after
    normalisation; other forms by math-verify when installed)."""
    if completion_answer is None:
        return False
    a, b = normalize_number(completion_answer), normalize_number(gold)
    if a is not None and b is not None:
        return a == b
    if not use_math_verify:
        return completion_answer.strip() == gold.strip()
    try:
        from math_verify import parse, verify
    except ImportError as exc:  # optional dependency
        raise ImportError("non-numeric answers need `pip install math-verify`") from exc
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns on every call without timeouts
    g = parse(f"${gold}$" if "$" not in gold else gold, parsing_timeout=None)
    p = parse(completion_answer if "$" in completion_answer or "\\" in completion_answer
              else f"${completion_answer}$", parsing_timeout=None)
    return bool(g) and bool(p) and bool(verify(g, p, timeout_seconds=None))


@register_reward("math/correct")
def math_correct(prompt: str, completion: str, answer: str | None = None, **_) -> float:
    """1.0 if the completion's final answer equals `answer` (a GSM8K answer field or a bare
    final answer), else 0.0. No deadline of its own: run it in a RewardRunner."""
    if answer is None:
        return 0.0
    return 1.0 if math_equal(extract_answer(completion), gsm8k_gold(str(answer))) else 0.0
