"""The local byte tokenizer: exact round trip, special ids, and AutoTokenizer reload."""

import pytest
from transformers import AutoTokenizer

from baton.models import build_char_tokenizer, build_tiny_model, save_pretrained

TEXTS = ["12+7+30=", "49", " a  b\n\tc ", "x='ll' é€ <eos>?"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_one_token_per_byte_and_round_trip(tok):
    for s in TEXTS:
        ids = tok(s)["input_ids"]
        if "<eos>" not in s:
            assert len(ids) == len(s.encode()), s  # no merges, no BOS
        assert tok.decode(ids) == s


def test_specials(tok):
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert len(tok) == 260
    assert tok("7<eos>")["input_ids"][-1] == tok.eos_token_id
    assert tok.decode(tok("7<eos>")["input_ids"], skip_special_tokens=True) == "7"
    assert tok.padding_side == "left"


def test_chat_template_ends_assistant_turn_with_eos(tok):
    text = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "3"}], tokenize=False
    )
    assert text == "1+2=3<eos>"


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_autotokenizer_reload_gives_same_ids(tok, tmp_path, family):
    # AutoTokenizer picks its class from the model type next to it (qwen2 -> Qwen2Tokenizer
    # in transformers 5), so save it beside a model of each family.
    model = build_tiny_model("0.75m", family=family, vocab_size=len(tok), layers=1)
    save_pretrained(model, tok, tmp_path / "ckpt")
    loaded = AutoTokenizer.from_pretrained(str(tmp_path / "ckpt"), local_files_only=True)
    for s in TEXTS:
        assert loaded(s)["input_ids"] == tok(s)["input_ids"], (type(loaded).__name__, s)
        assert loaded.decode(loaded(s)["input_ids"]) == s
    assert (loaded.pad_token_id, loaded.eos_token_id, len(loaded)) == (0, 2, 260)
