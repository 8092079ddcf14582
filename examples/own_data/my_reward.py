"""The worked example's reward (docs/OWN_DATA.md): `reward(prompt, completion, **row) -> float`.

Every field of a train.jsonl row but the prompt arrives as a keyword argument (here `answer`).
Partial credit for a near miss keeps groups from tying (all 0 or all 1), which would leave
GRPO nothing to learn from; `reward/tied_group_frac` in metrics.jsonl shows how many did.
"""


def close_enough(prompt: str, completion: str, answer: str = "", **row) -> float:
    """1.0 for the exact answer, 0.5 when one off, else 0.0."""
    try:
        miss = abs(int(completion.strip()) - int(answer))
    except ValueError:
        return 0.0
    return 1.0 if miss == 0 else 0.5 if miss == 1 else 0.0
