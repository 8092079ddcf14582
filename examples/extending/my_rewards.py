"""A custom reward function (docs/EXTENDING.md, part 1): `reward(prompt, completion, **row)`.

Name it in a recipe as `my_rewards:short_answer`; `baton` imports it from the working
directory in the driver and in its reward worker processes, no registration needed.
"""


def short_answer(prompt: str, completion: str, **row) -> float:
    """1.0 for an answer of at most 3 characters (a shaping term beside correctness)."""
    return 1.0 if len(completion.strip()) <= 3 else 0.0
