"""The data a run reads, checked before anything runs: every data file a config names
(`data.path`, `data.eval_path`: prompt rows, SFT rows, DPO or reward-model pairs) is read,
parsed and checked row by row before the model loads and before the run dir is written.
`open_run` calls `check_data(cfg)` for every driver; `baton eval` calls `check_row_files`.

    check_data(cfg)                                  a driver's config: its files, as it reads them
    check_row_files(data, model_path, budget)        prompt rows (a DataConfig-like section)
    check_pair_files(data, model_path)               preference pairs (offline DPO, reward models)

What is refused (a `baton.data.records.DataError`: one line naming the file, the line or row,
and the field; the CLI exits 2): a missing file, a directory, an empty file, bytes that are
not UTF-8, a line that is not JSON, a row that is not an object, a bad parquet file, a row
without a prompt, an empty prompt, a row without a field its task scores against
(`baton.envs.base.row_fields`: "answer"), a pair without a string prompt / chosen /
rejected, a file whose every row is held out (nothing to train on) or none is (nothing to
evaluate on), and a row whose tokens plus the generation budget exceed the model's context
(`baton.data.validate.LengthCheck`: a 50 MB row is refused by its length alone; rows are streamed). A UTF-8
byte-order mark is accepted. Pairs with chosen == rejected are left out with a warning that
counts them (`baton.data.records.located_pairs`).
"""

from __future__ import annotations

from typing import Any

from baton.data.records import DataError, located_pairs, normalize_row, read_records, render_prompt
from baton.data.validate import LengthCheck
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
    need, target = row_fields(get_task(data.task)), getattr(data, "TARGET_FIELD", "")  # SFT: a row's own target
    eval_size = max(getattr(data, "eval_size", 1), 1)
    counts, held_rows = _read_rows(data, model_path, budget, need, target, eval_size)
    if split and getattr(data, "path", ""):
        _check_split(data, counts, held_rows, need, target, eval_size)


def _read_rows(data: Any, model_path: str | None, budget: int, need: tuple, target: str,
               eval_size: int) -> tuple[dict[str, int], list[dict]]:
    """Every row of the files parsed and fit to the context; ({key: rows}, data.path's held-out
    rows (task_rows' split, when it splits))."""
    from baton.trainers.session.state import HOLD_EVERY

    fit = _fit(model_path, budget, "rollout.max_new_tokens") if model_path else None
    counts, held_rows = {}, []
    for key, path in _files(data).items():  # streamed: no list of the rows (a 2M-row file is checked in place)
        require = tuple(f"{f}|{target}" for f in need) if target and key == "path" else need
        counts[key] = 0
        for where, raw in read_records(path, f"data.{key}"):
            row = normalize_row(raw, where, require)
            if key == "path" and not data.eval_path and counts[key] % HOLD_EVERY == 0 and len(held_rows) < eval_size:
                held_rows.append(row)
            counts[key] += 1
            if fit is not None:
                fit(where, row["prompt"])
    if fit is not None:
        fit.finish()
    return counts, held_rows


def _check_split(data: Any, counts: dict[str, int], held_rows: list[dict], need: tuple, target: str,
                 eval_size: int) -> None:
    """Rows left to train on, and held-out rows (scorable) to evaluate on when data.eval_size asks."""
    from baton.trainers.session.config import DataConfig
    from baton.trainers.session.state import HOLD_EVERY, is_file_task, task_rows

    rows = counts.get("path", 0)
    if is_file_task(data.task):  # a loader of its own (gsm8k): its split
        train, held = task_rows(DataConfig(task=data.task, path=data.path, eval_path=data.eval_path,
                                           eval_size=eval_size, seed=data.seed), target)
        n_train, n_held = len(train), len(held)
    else:  # task_rows' split, from the counts: data.eval_path's rows (scored: read with `need`), else every 10th
        n_train = rows - (0 if data.eval_path else len(range(0, rows, HOLD_EVERY)))
        n_held, held = (min(counts["eval_path"], eval_size), []) if data.eval_path else (len(held_rows), held_rows)
    if not n_train:
        raise DataError(f"data.path={data.path}: all of its {rows} row(s) are held out for evaluation (every 10th "
                        f"row, the first included, or the task's own split): nothing to train on; add rows or "
                        f"give the held-out rows in data.eval_path")
    unscored = next((r for r in held if any(r.get(f) is None for f in need)), None)
    if unscored is not None and getattr(data, "eval_size", 1) > 0:  # a held-out row is scored by the task
        raise DataError(f"data.path={data.path}: the held-out row {str(unscored['prompt'])[:60]!r} has no "
                        f"{need[0]!r} field, which evaluation scores it against (every 10th row is held out "
                        f"unless data.eval_path gives held-out rows)")
    if not n_held and getattr(data, "eval_size", 1) > 0:
        raise DataError(f"data.path={data.path}: none of its {rows} row(s) is held out for evaluation: add rows, "
                        f"give data.eval_path, or set data.eval_size=0 where the driver allows it")


def check_pair_files(data: Any, model_path: str | None) -> None:
    """Preference pairs of `data.path` / `data.eval_path`: parsed, and each prompt with its
    longer completion and an EOS within `model_path`'s context."""
    located = [pair for key, path in _files(data).items() for pair in located_pairs(path, f"data.{key}")]
    fit = _fit(model_path, 1, "the EOS") if model_path else None
    if fit is not None:
        for where, p in located:
            fit(where, p["prompt"] + max(p["chosen"], p["rejected"], key=len))
        fit.finish()


class _Fit:
    """`LengthCheck` of (where, prompt) against a model's context and tokenizer, a row at a time;
    chat prompts rendered with its chat template (as the engine renders them)."""

    def __init__(self, tokenizer: Any, check: LengthCheck):
        self.tokenizer, self.check = tokenizer, check

    def __call__(self, where: str, prompt: Any) -> None:
        if isinstance(prompt, str):
            self.check.add(where, prompt)
            return
        try:
            text = render_prompt(self.tokenizer, prompt)
        except ValueError as e:  # no chat template
            raise DataError(f"{where}: field 'prompt': {e}") from None
        self.check.add(where, text, add_special_tokens=False)

    def finish(self) -> None:
        self.check.finish()


def _fit(model_path: str, budget: int, budget_key: str) -> _Fit | None:
    """The length check for `model_path` (None when its context is not known)."""
    from baton.models.load import adapter_base, load_tokenizer
    from baton.models.validate import model_context

    context = model_context(adapter_base(model_path) or model_path)
    if context is None:
        return None
    tokenizer = load_tokenizer(model_path)
    return _Fit(tokenizer, LengthCheck(tokenizer, context, budget, budget_key))
