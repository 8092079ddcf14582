"""Data as users already have it: jsonl or parquet rows in verl's, GSM8K's or baton's shape,
normalised to baton's rows, and chat-message prompts rendered with the tokenizer's template.

    rows = load_rows("data/gsm8k/train.parquet")    # verl's preprocessed GSM8K
    rows = load_rows("my.jsonl")                     # {"question", "answer": "... #### 18"}
    text = render_prompt(tokenizer, rows[0]["prompt"])

Row shapes recognised (per row, so a file may mix them):
  verl      {"prompt": [{"role", "content"}, ...], "reward_model": {"ground_truth": ...},
             "data_source": ..., "extra_info": {...}}
            -> {"prompt": messages, "answer": ground_truth, "data_source", "extra_info"}
  GSM8K     {"question": str, "answer": "... #### N"} -> {"prompt": question, "answer": answer}
  baton     {"prompt": str | messages, "answer"?: ..., ...} (kept as is)
A prompt is a string (used as is) or a list of chat messages (rendered with the tokenizer's
chat template, with the generation prompt). Parquet needs `pyarrow` (imported on use).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

Row = dict[str, Any]


def normalize_row(raw: Row, where: str = "row") -> Row:
    """One row in baton's shape (see the module docstring); ValueError naming `where` if it
    has no prompt in any known shape."""
    row = dict(raw)
    if "prompt" not in row and "question" in row:  # GSM8K
        row["prompt"] = row.pop("question")
    if "prompt" not in row:
        raise ValueError(f"{where}: no 'prompt' (baton / verl) or 'question' (GSM8K) field: {sorted(raw)}")
    rm = row.get("reward_model")
    if isinstance(rm, dict) and "answer" not in row and rm.get("ground_truth") is not None:  # verl
        row["answer"] = rm["ground_truth"]
    prompt = row["prompt"]
    if hasattr(prompt, "tolist"):  # a numpy array of messages (parquet via pandas)
        prompt = prompt.tolist()
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise ValueError(f"{where}: a list prompt must be chat messages with 'role' and 'content'")
        prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    elif not isinstance(prompt, str):
        raise ValueError(f"{where}: prompt must be a string or a list of chat messages, got {type(prompt).__name__}")
    row["prompt"] = prompt
    if "answer" in row and row["answer"] is not None and not isinstance(row["answer"], str):
        row["answer"] = str(row["answer"])
    return row


def load_rows(path: str | os.PathLike, limit: int | None = None) -> list[Row]:
    """Rows of a .jsonl / .json (a list) / .parquet file, normalised."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {str(p)!r}")
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("reading parquet needs `pip install pyarrow`") from exc
        raw = pq.read_table(p).to_pylist()
    elif p.suffix == ".json":
        raw = json.loads(p.read_text())
        if not isinstance(raw, list):
            raise ValueError(f"{p}: a .json data file must hold a list of rows")
    else:
        raw = []
        with open(p) as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        raw.append(json.loads(line))
                    except ValueError as exc:
                        raise ValueError(f"{p}:{lineno}: not JSON: {exc}") from None
    raw = raw if limit is None else raw[:limit]
    return [normalize_row(r, f"{p}:{i + 1}") for i, r in enumerate(raw)]


def render_prompt(tokenizer: Any, prompt: str | list[dict[str, str]]) -> str:
    """A string prompt as is; chat messages through the tokenizer's chat template (with the
    assistant's generation prompt)."""
    if isinstance(prompt, str):
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the prompt is a list of chat messages but the tokenizer has no chat template")
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def prompt_ids(tokenizer: Any, prompt: str | list[dict[str, str]]) -> list[int]:
    """Token ids of a prompt (a rendered chat template carries its own special tokens)."""
    text = render_prompt(tokenizer, prompt)
    return list(tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"])
