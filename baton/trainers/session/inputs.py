"""The data a run reads, checked before anything runs: every data file a config names
(`data.path`, `data.eval_path`: prompt rows, SFT rows, DPO or reward-model pairs) is read,
parsed and checked row by row before the model loads and before the run dir is written.
`open_run` calls `check_data(cfg)` for every driver; `baton eval` calls `check_row_files`.

    check_data(cfg)                                  a driver's config: its files, as it reads them
    check_row_files(data, model_path, budget)        prompt rows (a DataConfig-like section)
    check_pair_files(data, model_path)               preference pairs (offline DPO, reward models)

What is refused (a `baton.data.rows.DataError`: one line naming the file, the line or row,
and the field; the CLI exits 2): a missing file, a directory, an empty file, bytes that are
not UTF-8, a line that is not JSON, a row that is not an object, a bad parquet file, a row
without a prompt, an empty prompt, a row without a field its task scores against
(`baton.envs.base.row_fields`: "answer"), a pair without a string prompt / chosen /
rejected, a file whose every row is held out (nothing to train on) or none is (nothing to
evaluate on), and a row whose tokens plus the generation budget exceed the model's context
(`baton.data.validate.check_lengths`: a 50 MB row is refused by its length alone). A UTF-8
byte-order mark is accepted. Pairs with chosen == rejected are left out with a warning that
counts them (`baton.data.rows.located_pairs`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from baton.data.rows import DataError, located_pairs, located_rows, render_prompt
from baton.data.validate import check_lengths
from baton.envs import get_task
from baton.envs.base import row_fields

FILE_KEYS = ("path", "eval_path")


def _files(data: Any) -> dict[str, str]:
    return {key: getattr(data, key) for key in FILE_KEYS if getattr(data, key, "")}


def data_files(cfg: Any) -> dict[str, str]:
    """{"data.path": FILE, ...}: the data files `cfg` reads (what a resume fingerprints)."""
    data = getattr(cfg, "data", None)
    return {f"data.{key}": path for key, path in _files(data).items()} if data is not None else {}


def check_data(cfg: Any) -> None:
    """Every data file `cfg.data` names, as its driver reads it (see the module docstring):
    pairs for a `data:` section that says `FILE_KIND = "pairs"`, prompt rows otherwise."""
    data = getattr(cfg, "data", None)
    if data is None or not _files(data):
        return  # a task's own rows: generated, nothing to read
    model_path = getattr(getattr(cfg, "model", None), "path", None)
    if getattr(data, "FILE_KIND", "rows") == "pairs":
        check_pair_files(data, model_path)
        return
    rollout = getattr(cfg, "rollout", None)
    check_row_files(data, model_path, rollout.max_new_tokens if rollout is not None else 0)


def check_row_files(data: Any, model_path: str | None, budget: int, split: bool = True) -> None:
    """Prompt rows of `data.path` / `data.eval_path` for `data.task`: parsed with the fields
    the task scores against, within `model_path`'s context with `budget` new tokens, and
    (`split`: a training run) split leaving rows to train on, and to evaluate on when
    `data.eval_size` asks for some."""
    from baton.trainers.session.config import DataConfig
    from baton.trainers.session.state import task_rows

    task, target = get_task(data.task), getattr(data, "TARGET_FIELD", "")  # SFT: a row's own target
    need = row_fields(task)
    located = [pair for key, path in _files(data).items() for pair in located_rows(
        path, tuple(f"{f}|{target}" for f in need) if target and key == "path" else need, f"data.{key}")]
    if model_path:
        _check_fit(model_path, [(where, row["prompt"]) for where, row in located], budget, "rollout.max_new_tokens")
    if not split or not getattr(data, "path", ""):
        return
    train, held = task_rows(DataConfig(task=data.task, path=data.path, eval_path=data.eval_path,
                                       eval_size=max(getattr(data, "eval_size", 1), 1), seed=data.seed), target)
    rows = sum(1 for where, _ in located if where.startswith(str(Path(data.path))))
    if not train:
        raise DataError(f"data.path={data.path}: all of its {rows} row(s) are held out for evaluation (every 10th "
                        f"row, the first included, or the task's own split): nothing to train on; add rows or "
                        f"give the held-out rows in data.eval_path")
    unscored = next((r for r in held if any(r.get(f) is None for f in need)), None)
    if unscored is not None and getattr(data, "eval_size", 1) > 0:  # a held-out row is scored by the task
        raise DataError(f"data.path={data.path}: the held-out row {str(unscored['prompt'])[:60]!r} has no "
                        f"{need[0]!r} field, which evaluation scores it against (every 10th row is held out "
                        f"unless data.eval_path gives held-out rows)")
    if not held and getattr(data, "eval_size", 1) > 0:
        raise DataError(f"data.path={data.path}: none of its {rows} row(s) is held out for evaluation: add rows, "
                        f"give data.eval_path, or set data.eval_size=0 where the driver allows it")


def check_pair_files(data: Any, model_path: str | None) -> None:
    """Preference pairs of `data.path` / `data.eval_path`: parsed, and each prompt with its
    longer completion and an EOS within `model_path`'s context."""
    located = [pair for key, path in _files(data).items() for pair in located_pairs(path, f"data.{key}")]
    if model_path:
        texts = [(where, p["prompt"] + max(p["chosen"], p["rejected"], key=len)) for where, p in located]
        _check_fit(model_path, texts, 1, "the EOS")


def _check_fit(model_path: str, located: list[tuple[str, Any]], budget: int, budget_key: str) -> None:
    """`check_lengths` of (where, prompt) against `model_path`'s context and tokenizer; chat
    prompts rendered with its chat template (as the engine renders them)."""
    from baton.models.load import adapter_base, load_tokenizer
    from baton.models.validate import model_context

    context = model_context(adapter_base(model_path) or model_path)
    if context is None or not located:
        return
    tokenizer = load_tokenizer(model_path)
    plain, chat = [], []
    for where, prompt in located:
        if isinstance(prompt, str):
            plain.append((where, prompt))
            continue
        try:
            chat.append((where, render_prompt(tokenizer, prompt)))
        except ValueError as e:  # no chat template
            raise DataError(f"{where}: field 'prompt': {e}") from None
    check_lengths(plain, tokenizer, context, budget, budget_key)
    check_lengths(chat, tokenizer, context, budget, budget_key, add_special_tokens=False)
