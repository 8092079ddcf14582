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
import logging
import os
from pathlib import Path
from typing import Any, Iterator

from baton.config import ConfigError

Row = dict[str, Any]
log = logging.getLogger("baton")


class DataError(ConfigError):
    """A data file that cannot be used as it is: one line naming the file, the line (or row)
    and the field (the CLI prints it and exits 2, before a run writes anything)."""


_PARSED: dict[tuple, list[tuple[str, Any]]] = {}  # the last files parsed, by (path, size, mtime, key)


def read_records(path: str | os.PathLike, key: str = "data.path") -> list[tuple[str, Any]]:
    """(where, raw row) of every row of a .jsonl / .json (a list) / .parquet file; `where` is
    "FILE:LINE" (jsonl, json) or "FILE row N" (parquet). DataError (one line) for a missing
    file, a directory, a file with no rows, bytes that are not UTF-8, a line that is not
    JSON, or a bad parquet file. A UTF-8 byte-order mark is skipped. The last two files read
    are kept parsed (by path, size and mtime): the start checks and the driver read a file
    once (the raw rows are never changed: `normalize_row` copies them)."""
    p = Path(path)
    if p.is_dir():
        raise DataError(f"{key}={p}: is a directory, not a data file (a .jsonl, .json or .parquet file)")
    if not p.is_file():
        raise DataError(f"{key}={p}: no such file")
    st = p.stat()
    cache_key = (str(p.resolve()), st.st_size, st.st_mtime_ns, key)
    if cache_key not in _PARSED:
        records = _parse(p, key)
        while len(_PARSED) >= 2:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[cache_key] = records
    return list(_PARSED[cache_key])


def _parse(p: Path, key: str) -> list[tuple[str, Any]]:
    if p.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as exc:
            raise ImportError("reading parquet needs `pip install pyarrow`") from exc
        try:
            table = pq.read_table(p).to_pylist()
        except Exception as exc:  # pyarrow's errors have no common base: ArrowInvalid, OSError, ...
            raise DataError(f"{key}={p}: not a readable parquet file ({_first_line(exc)})") from None
        records = [(f"{p} row {i + 1}", r) for i, r in enumerate(table)]
    else:
        lines = _text_lines(p)
        if p.suffix == ".json":
            text = "".join(line for _, line in lines)
            try:
                rows = json.loads(text) if text.strip() else []
            except json.JSONDecodeError as exc:
                raise DataError(f"{p}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(rows, list):
                raise DataError(f"{p}: a .json data file must hold a list of rows, got {type(rows).__name__}")
            records = [(f"{p} row {i + 1}", r) for i, r in enumerate(rows)]
        else:  # each line parsed as it is read: the file's text is never held whole beside its rows
            records = []
            for lineno, line in lines:
                if line.strip():
                    try:
                        records.append((f"{p}:{lineno}", json.loads(line.strip())))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{p}:{lineno}: not JSON ({exc.msg} at column {exc.colno})") from None
    if not records:
        raise DataError(f"{key}={p}: holds no rows (an empty file)")
    for where, raw in records:
        if not isinstance(raw, dict):
            raise DataError(f"{where}: a row must be a JSON object ({{\"prompt\": ...}}), got a "
                            f"{type(raw).__name__}")
    return records


def _text_lines(p: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of `p`, decoded as UTF-8 (a byte-order mark skipped);
    DataError naming the line and byte otherwise."""
    with open(p, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                yield lineno, raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{p}:{lineno}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                                f"{exc.start + 1}); save the file as UTF-8") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def normalize_row(raw: Row, where: str = "row", require: tuple[str, ...] = ()) -> Row:
    """One row in baton's shape (see the module docstring); DataError naming `where` and the
    field if it has no prompt in any known shape, an empty one, or lacks a field of `require`
    (e.g. "answer", which a task's verifier reads; "answer|target": either)."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be a JSON object, got a {type(raw).__name__}")
    row = dict(raw)
    if "prompt" not in row and "question" in row:  # GSM8K
        row["prompt"] = row.pop("question")
    if "prompt" not in row:
        raise DataError(f"{where}: no 'prompt' (baton / verl) or 'question' (GSM8K) field: {sorted(raw)}")
    rm = row.get("reward_model")
    if isinstance(rm, dict) and "answer" not in row and rm.get("ground_truth") is not None:  # verl
        row["answer"] = rm["ground_truth"]
    prompt = row["prompt"]
    if hasattr(prompt, "tolist"):  # a numpy array of messages (parquet via pandas)
        prompt = prompt.tolist()
    if isinstance(prompt, list):
        if not all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt):
            raise DataError(f"{where}: field 'prompt': a list prompt must be chat messages with 'role' and "
                            f"'content'")
        prompt = [{"role": str(m["role"]), "content": str(m["content"])} for m in prompt]
    elif not isinstance(prompt, str):
        raise DataError(f"{where}: field 'prompt' must be a string or a list of chat messages, got "
                        f"{type(prompt).__name__}")
    if not prompt or (isinstance(prompt, str) and not prompt.strip()):
        raise DataError(f"{where}: field 'prompt' is empty")
    row["prompt"] = prompt
    if "answer" in row and row["answer"] is not None and not isinstance(row["answer"], str):
        row["answer"] = str(row["answer"])
    for need in require:  # "answer", or "answer|target": one of them
        names = need.split("|")
        if all(row.get(name) is None for name in names):
            shape = " (GSM8K 'answer', verl 'reward_model.ground_truth')" if names[0] == "answer" else ""
            alts = "".join(f" or {name!r}" for name in names[1:])
            raise DataError(f"{where}: no {names[0]!r} field{shape}{alts}, which the task scores each row against: "
                            f"{sorted(raw)}")
    return row


def located_rows(path: str | os.PathLike, require: tuple[str, ...] = (),
                 key: str = "data.path") -> list[tuple[str, Row]]:
    """(where, row) of a .jsonl / .json (a list) / .parquet file (`read_records`), each row
    normalised and holding the fields of `require` (DataError, one line, naming it otherwise)."""
    return [(where, normalize_row(r, where, require)) for where, r in read_records(path, key)]


def load_rows(path: str | os.PathLike, limit: int | None = None, require: tuple[str, ...] = (),
              key: str = "data.path") -> list[Row]:
    """The rows of `located_rows` (the first `limit`)."""
    rows = [row for _, row in located_rows(path, require, key)]
    return rows if limit is None else rows[:limit]


PAIR_KEYS = ("prompt", "chosen", "rejected")


def identical_pairs(path: str | os.PathLike, key: str = "data.path") -> list[str]:
    """Where (FILE:LINE) the pairs of `path` with chosen == rejected are (left out by
    `located_pairs`; offline DPO counts them in `data/identical_pairs`)."""
    return [where for where, raw in read_records(path, key)
            if isinstance(raw.get("chosen"), str) and raw.get("chosen") == raw.get("rejected")]


def located_pairs(path: str | os.PathLike, key: str = "data.path") -> list[tuple[str, dict[str, str]]]:
    """(where, pair) of a jsonl of preference pairs, {"prompt", "chosen", "rejected"} strings
    each (`read_records`; DataError naming the line and the field otherwise). Pairs whose
    chosen and rejected texts are the same teach nothing (their DPO / Bradley-Terry gradient
    is 0): they are left out with a warning that counts them, and a file of nothing else is
    refused."""
    rows, same = [], []
    for where, raw in read_records(path, key):
        bad = [k for k in PAIR_KEYS if not isinstance(raw.get(k), str)]
        if bad:
            raise DataError(f"{where}: field {bad[0]!r} missing or not a string (a pair needs string fields "
                            f"{list(PAIR_KEYS)})")
        if not raw["prompt"].strip():
            raise DataError(f"{where}: field 'prompt' is empty")
        if raw["chosen"] == raw["rejected"]:
            same.append(where)
        else:
            rows.append((where, {k: raw[k] for k in PAIR_KEYS}))
    if same and not rows:
        raise DataError(f"{key}={path}: every pair has chosen == rejected (e.g. {same[0]}): nothing to learn")
    if same:
        log.warning("%s=%s: %d of %d pairs have chosen == rejected (the first: %s); left out, they teach nothing",
                    key, path, len(same), len(same) + len(rows), same[0])
    return rows


def load_pairs(path: str | os.PathLike, key: str = "data.path") -> list[dict[str, str]]:
    """The pairs of `located_pairs`."""
    return [pair for _, pair in located_pairs(path, key)]


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
