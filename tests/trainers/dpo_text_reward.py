"""A reward for DPO runs on a random tiny model (which never answers arithmetic right, so
every verifier score would tie and no pair would be made): a fixed pseudo-random score of
the completion's text, so the samples of a prompt differ and pair.

Its own module, importing only the standard library, so that the reward runner's worker
processes (and Ray workers) load it in milliseconds: named in a recipe as
`dpo_text_reward:text_hash` (tests/trainers is on sys.path under pytest)."""

import zlib


def text_hash(prompt: str, completion: str, **row) -> float:
    return float(zlib.crc32(completion.encode()) % 5)
