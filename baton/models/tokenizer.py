"""A byte-level, one-token-per-byte tokenizer built locally (no hub), saved in HF format.

The demo models are tiny and the tasks are short strings of digits and operators, so one
token per byte keeps the vocabulary (260 ids) and the embedding table small, makes every
digit of a number visible to the model, and round-trips any text exactly.

Why byte-level BPE with no merges rather than a plain char WordLevel model: transformers 5
`AutoTokenizer` ignores `tokenizer.json`'s pipeline for some model types (qwen2 is forced
onto `Qwen2Tokenizer`, which rebuilds a byte-level BPE pipeline from the saved vocab and
merges). Using exactly that pipeline with an empty merge list means every load path
(`Qwen2Tokenizer`, `TokenizersBackend`/`PreTrainedTokenizerFast`) gives the same ids.

No BOS is added automatically: prompts tokenize to exactly their bytes, so the rollout
engine, the trainer and the SFT loop agree on token ids whichever way they call the
tokenizer (`add_special_tokens` makes no difference).
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3, in this order; bytes are 4..259

# The GPT-2/Qwen2 split regex; with no merges it cannot change the ids, but keeping
# Qwen2Tokenizer's exact pipeline makes the saved tokenizer.json identical in behaviour.
_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Roles are plain text: the tiny models cannot afford long role markers, and the
# arithmetic task uses raw prompts (no template) anyway. An assistant turn ends in EOS
# so that SFT on templated chats teaches the model to stop.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ message['content'] }}{% endif %}"
    "{% endfor %}"
)


def _byte_symbols() -> list[str]:
    """The 256 printable stand-ins ByteLevel uses for bytes 0..255, in byte order."""
    # GPT-2's bytes_to_unicode: printable latin-1 bytes map to themselves, the rest
    # to code points from 256 upward, in byte order.
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def build_char_tokenizer() -> PreTrainedTokenizerFast:
    """Return a byte-level fast tokenizer: specials at ids 0..3, byte b at id 4 + b."""
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *_byte_symbols()])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",  # prompts are left-padded for generation (see baton.fields)
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok
