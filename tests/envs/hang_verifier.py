"""A verifier that never returns on some inputs (a pathological input to a symbolic checker);
a module of its own with no heavy imports, so a fresh reward worker loads it fast."""

import time


def hang(prompt, completion, **_):
    if "hang" in completion:
        time.sleep(60)
    return 1.0
