"""A latency-bound verifier for bench/async_overlap.py: arithmetic correctness after a
20 ms wait per call, as a remote verifier or environment would take (the wait holds no CPU).
Named in a recipe as `_latency_reward:correct_after_20ms` (bench/ is on the path of the
bench's processes). Standard library only, so each reward worker process starts in ~0.1 s
(the check is `baton.envs.arithmetic.verify`'s, whose module imports torch)."""

import time

WAIT_S = 0.020


def correct_after_20ms(prompt: str, completion: str, answer: str | None = None, **_) -> float:
    time.sleep(WAIT_S)
    if answer is None:
        return 0.0
    return float(completion.split("<eos>", 1)[0].strip() == str(answer).strip())
