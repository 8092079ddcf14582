"""Shared parts of the benchmarks: the one import of the RL training driver, and smoke mode.

Every script under bench/ takes `--smoke`: tiny sizes and 1-2 steps, so that
tests/test_bench_smoke.py can run each one in seconds and none rots unnoticed.
Scripts run as `python bench/<name>.py`, so bench/ is on sys.path and they import this
module as `_common`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
DEMO_MODEL = REPO / "checkpoints" / "arith-sft"

# Recipe overrides that shrink a training run to a smoke test: 2 prompts x 2 samples x 4 tokens.
SMOKE_TRAIN = ["data.prompts_per_step=2", "rollout.n=2", "rollout.max_new_tokens=4",
               "data.eval_size=2",
               "actor.mini_batch_size=0", "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress=false"]
# PPO with its critic (a critic-free method's `critic=null` would lose these keys: use SMOKE_TRAIN)
SMOKE_PPO = [*SMOKE_TRAIN, "critic.pretrain_steps=0", "critic.mini_batch_size=0"]


def driver(algorithm: str = "grpo") -> tuple[Callable[[Any], Any], type]:
    """(train, config class) of baton's driver for `algorithm` (baton.trainers.algorithms).

    The only place bench/ imports a trainer."""
    from baton.trainers.algorithms import config_class
    from baton.trainers.algorithms import driver as train_of

    return train_of(algorithm), config_class(algorithm)


def load_rl_config(algorithm: str, recipe: str | Path | None, overrides: list[str]) -> Any:
    """The driver's config for `algorithm`, loaded from a recipe with dotted overrides as
    `baton train` loads it (`placement.auto` applied where the config asks for it)."""
    from baton.trainers.algorithms import load_recipe

    return load_recipe(algorithm, None if recipe is None else str(recipe), overrides)


def add_smoke(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes, 1-2 steps: only checks that the script runs (CI)")


def tiny_model(preset: str = "0.75m") -> str:
    """A random tiny HF checkpoint in a fresh temp dir (smoke runs do not need the trained demo model)."""
    from baton.models.make import make_tiny_checkpoint

    return str(make_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="bench-smoke-")) / "model", preset=preset))


# The Qwen2.5-0.5B shape (random weights): hidden 896, 24 layers, 14 heads, 2 KV heads, vocab 151936.
QWEN25_05B = dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab_size=151936)


def wide_tokenizer(vocab_size: int) -> Any:
    """baton's byte tokenizer widened to `vocab_size` ids, for benchmarks at a real vocabulary:
    ids past the 260 byte/special tokens are fillers (three byte symbols each) that encoding
    never produces (no merges) and decoding turns into bytes, so a random model that samples
    them still decodes."""
    from tokenizers import Tokenizer, models

    from baton.models.tokenizer import SPECIAL_TOKENS, _byte_symbols, build_char_tokenizer

    tok = build_char_tokenizer()
    sym = _byte_symbols()
    vocab = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *sym])}
    for i in range(len(vocab), vocab_size):
        j = i - len(SPECIAL_TOKENS) - len(sym)
        vocab[sym[j % 256] + sym[(j // 256) % 256] + sym[(j // 65536) % 256] + sym[j // 16777216]] = i
    backend = tok.backend_tokenizer
    wide = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    wide.normalizer, wide.pre_tokenizer, wide.decoder = backend.normalizer, backend.pre_tokenizer, backend.decoder
    from transformers import PreTrainedTokenizerFast

    out = PreTrainedTokenizerFast(tokenizer_object=wide, pad_token=tok.pad_token, bos_token=tok.bos_token,
                                  eos_token=tok.eos_token, unk_token=tok.unk_token, padding_side="left")
    out.chat_template = tok.chat_template
    return out


def random_model_dir(shape: str, out_dir: str | Path, seed: int = 0, device: str = "cpu") -> str:
    """A random HF checkpoint of a tiny preset ("5m", "25m", ...) or of "qwen2.5-0.5b" (the
    real vocabulary, `wide_tokenizer`), saved to `out_dir`. device "cuda": the 0.5B is built
    on the GPU and saved in bf16 (on one CPU thread its init alone takes ~15 s, and fp32
    files are 2 GB; the sides load it in their own dtypes)."""
    import torch

    from baton.models.make import make_tiny_checkpoint

    if shape != "qwen2.5-0.5b":
        return str(make_tiny_checkpoint(out_dir, preset=shape, seed=seed))
    from baton.models import build_tiny_model
    from baton.models.load import save_pretrained

    tok = wide_tokenizer(QWEN25_05B["vocab_size"])
    with torch.device(device):
        model = build_tiny_model(None, seed=seed, max_position=1024, **QWEN25_05B)
    return str(save_pretrained(model.to(torch.bfloat16) if device == "cuda" else model, tok, out_dir))


def child_paths(script: str, paths: tuple[str, ...], tmp: str, args: list[str]) -> dict[str, dict]:
    """Run `script --path P --out tmp/P.pt *args` for each path P in a fresh process of its
    own (one measurement each, no allocator state shared); each prints one JSON line last,
    echoed here and returned by path."""
    results = {}
    for path in paths:
        cmd = [sys.executable, script, "--path", path, "--out", str(Path(tmp) / f"{path}.pt"), *args]
        line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
        results[path] = json.loads(line)
        print(line, flush=True)
    return results


def module_at(ref: str, path: str, name: str) -> Any:
    """The module `path` (a file of this repository) as it is at git revision `ref`, imported
    under `name`: an old version of one module side by side with today's in one process
    (e.g. `module_at("main", "baton/rollout/embedded/llama.py", "llama_main").LlamaRunner`)."""
    import importlib.util

    source = subprocess.run(["git", "-C", str(REPO), "show", f"{ref}:{path}"], check=True,
                            capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp(prefix="baton-ref-")) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
