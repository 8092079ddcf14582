"""Does a GGUF file `baton export --gguf` wrote generate what its checkpoint does? transformers'
GGUF loader reads the file back, and both models decode N prompts greedily (through the chat
template when the tokenizer has one); exit 1 unless every prompt's tokens are the same.

    python scripts/gguf_roundtrip.py CHECKPOINT_DIR OUT.gguf [--n 20] [--new-tokens 24]

The CI's real-model job (scripts/ci_real_model.sh) runs it on SmolLM2-135M-Instruct; the
default tests check the same on tiny models (tests/models/test_gguf.py::same_greedy).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

QUESTIONS = ["What is the capital of France?", "Compute 6 times 7.", "What is 17 + 25?", "Name a primary colour.",
             "Write one word that rhymes with cat.", "What is 9 minus 4?", "Say hello in Spanish.",
             "How many legs does a spider have?", "What is the opposite of hot?", "Spell the word 'tree'.",
             "What is 12 divided by 3?", "Name a fruit that is yellow.", "What day comes after Monday?",
             "What is 2 to the power of 5?", "Give a synonym for big.", "What colour is the sky?",
             "What is 100 - 37?", "Name a planet.", "What is 8 + 8?", "Count from 1 to 5."]


def prompt_ids(tok, text: str) -> torch.Tensor:
    if tok.chat_template:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_dict=True)["input_ids"]
        return torch.tensor([ids])
    return tok(text, return_tensors="pt").input_ids


def greedy(model, ids: torch.Tensor, new_tokens: int, pad: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=pad)
    return out[0, ids.shape[1]:].tolist()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("gguf")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=24)
    args = ap.parse_args(argv)
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    g = Path(args.gguf).resolve()
    tok_a = AutoTokenizer.from_pretrained(args.checkpoint)
    tok_b = AutoTokenizer.from_pretrained(str(g.parent), gguf_file=g.name)
    model_a = AutoModelForCausalLM.from_pretrained(args.checkpoint, dtype=torch.float32).eval()
    model_b = AutoModelForCausalLM.from_pretrained(str(g.parent), gguf_file=g.name, dtype=torch.float32).eval()
    pad = tok_a.pad_token_id if tok_a.pad_token_id is not None else tok_a.eos_token_id
    same = 0
    for text in (QUESTIONS * (1 + args.n // len(QUESTIONS)))[: args.n]:
        a, b = prompt_ids(tok_a, text), prompt_ids(tok_b, text)
        out_a = greedy(model_a, a, args.new_tokens, pad)
        same += a.tolist() == b.tolist() and out_a == greedy(model_b, b, args.new_tokens, pad)
    print(f"gguf round trip: {same}/{args.n} prompts give the same greedy tokens ({args.new_tokens} new) "
          f"from {args.checkpoint} and {g.name}; e.g. {tok_a.decode(out_a, skip_special_tokens=True)!r}")
    return 0 if same == args.n else 1


if __name__ == "__main__":
    sys.exit(main())
