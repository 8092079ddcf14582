"""A resumed run checked against the run it continues, after `prepare_run_dir`
(baton/runs/rundir.py) chose to resume it:

* `check_resume_changes` compares the run dir's config.yaml with the new config and refuses
  changed hyperparameters unless `trainer.resume_changes=allow` (RESUMABLE_CHANGES: the keys
  that only drive or watch the run, which a resume may change); a torn config.yaml is one line.
* `check_data_unchanged` records the size and sha256 of each data file a run reads
  (RUN/data_files.json) and refuses a resume whose file was rewritten in place, unless allowed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from baton.runs.fsutil import CONFIG_END, YAMLFileError, read_yaml
from baton.runs.rundir import CONFIG_FILE, DATA_FILES, TORN_CONFIG, RunDirError

__all__ = ["RESUMABLE_CHANGES", "check_data_unchanged", "check_resume_changes", "file_fingerprint"]


# Keys a resume may change without trainer.resume_changes=allow: how the run is driven and
# watched, and where its services listen (a relaunch may find its ports taken), not what it
# computes.
RESUMABLE_CHANGES = ("trainer.resume", "trainer.steps", "trainer.progress", "trainer.overwrite",
                     "trainer.resume_changes", "trainer.sinks", "trainer.run_dir", "trainer.save_every",
                     "trainer.eval_every", "trainer.keep_checkpoints", "trainer.max_nonfinite_steps",
                     "trainer.check_weight_sync", "placement.threads_per_worker", "placement.cpus_per_worker",
                     "data.api_wait_s", "data.api_url", "data.servers", "data.weights_dir")


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): data}


def _same_value(x: Any, y: Any) -> bool:
    """Equal, or two spellings of one existing path (relative and absolute, say)."""
    if x == y:
        return True
    if isinstance(x, str) and isinstance(y, str) and x and y:
        try:
            return os.path.samefile(x, y)
        except OSError:
            return False
    return False


def _check_whole(path: Path, old: dict[str, Any], new_keys: list[str]) -> None:
    """YAMLFileError (one line, exit 2), when `path` (the run's config.yaml, flattened: `old`) was cut
    short: it lacks its end line (`baton.runs.fsutil.CONFIG_END`) and the keys it lacks are the last
    ones of the config (`new_keys`, in the order it is written). A torn file at a line boundary
    still parses; its absent keys are not changes to resume with."""
    if path.read_text().endswith(CONFIG_END):
        return
    new_keys = [k for k in new_keys if k not in RESUMABLE_CHANGES]  # keys a resume may add anyway
    absent = [k for k in new_keys if k not in old]
    present = [i for i, k in enumerate(new_keys) if k in old]
    if absent and (not present or all(new_keys.index(k) > present[-1] for k in absent)):
        raise YAMLFileError(f"{path}: is torn: it ends before its last {len(absent)} key(s) ({absent[0]} ...) and "
                          f"lacks its end line ({CONFIG_END.strip()!r}). Restore it, or delete it to resume with "
                          f"this config unchecked, or start over with trainer.overwrite=true")


def check_resume_changes(run_path: str | os.PathLike, new_config_dict: dict[str, Any], allow: bool) -> list[str]:
    """What differs between RUN/config.yaml (the run being resumed) and `new_config_dict`,
    as "key: old -> new" lines (keys in RESUMABLE_CHANGES ignored). Raises RunDirError, one
    line listing them, unless `allow`; no config.yaml: nothing to compare ([])."""
    import yaml

    path = Path(run_path) / CONFIG_FILE
    try:
        old = read_yaml(path, TORN_CONFIG) or {}
    except FileNotFoundError:
        return []
    new = yaml.safe_load(yaml.safe_dump(new_config_dict, sort_keys=False))  # tuples -> lists, as saved
    a, b = _flatten(old), _flatten(new)
    _check_whole(path, a, list(b))
    changes = [f"{k}: {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}"
               for k in sorted(set(a) | set(b), key=lambda k: (k not in b, k))
               if k not in RESUMABLE_CHANGES and not _same_value(a.get(k, "(absent)"), b.get(k, "(absent)"))]
    if changes and not allow:
        # a copied or moved run dir's config.yaml still names the dir it was made in: the hint
        # names this one, or following it would resume (or start) the run over there
        here = "" if _same_dir(a.get("trainer.run_dir"), run_path) else f" trainer.run_dir={Path(run_path)}"
        raise RunDirError(f"resuming {Path(run_path)} with a config that differs from its {CONFIG_FILE}: "
                          f"{'; '.join(changes)}. Set trainer.resume_changes=allow to resume with these "
                          f"changes, or put them back: `baton train {Path(run_path) / CONFIG_FILE} "
                          f"trainer.resume=auto{here}` resumes with the run's own config, overrides included")
    return changes


def _same_dir(saved: Any, run_path: str | os.PathLike) -> bool:
    """Whether a config.yaml's trainer.run_dir (relative to the working directory, as a run
    reads it) is `run_path`."""
    return isinstance(saved, str) and Path(saved).resolve() == Path(run_path).resolve()


def file_fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """{"path", "size", "sha256"} of a file (read once, in 1 MiB blocks)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return {"path": str(path), "size": os.path.getsize(path), "sha256": digest.hexdigest()}


def check_data_unchanged(run_path: str | os.PathLike, files: dict[str, str], fresh: bool, allow: bool,
                         notices: list[str] | None = None) -> list[str]:
    """Record (a fresh run) or compare (a resumed one) the fingerprints of the data files a
    run reads (`files`: {config key: path}) in RUN/data_files.json. A resumed run whose file
    under the same key and path changed (size or sha256: rewritten in place) is refused in one
    RunDirError line naming it, unless `allow` (trainer.resume_changes=allow): then the
    changes are returned as notices and the new fingerprints recorded. A key whose path
    changed is a config change (`check_resume_changes`). A torn DATA_FILES cannot be compared: that
    is said (appended to `notices`) and it is written anew, so the next resume compares again."""
    from baton.runs.fsutil import atomic_write_text

    path = Path(run_path) / DATA_FILES
    now = {key: file_fingerprint(p) for key, p in files.items() if os.path.isfile(p)}
    changes, torn = [], False
    if not fresh and path.is_file():
        try:
            before = json.loads(path.read_text())
            if not isinstance(before, dict):
                raise ValueError(f"a JSON {type(before).__name__}")
        except ValueError:
            before, torn = {}, True  # nothing to compare against (rewritten below)
            if notices is not None:
                notices.append(f"{path} is torn: this resume could not check that the data files are the ones "
                               f"the run started with; their fingerprints are recorded anew")
        for key, new in now.items():
            old = before.get(key)
            if old and old.get("path") == new["path"] and (old.get("size"), old.get("sha256")) != (
                    new["size"], new["sha256"]):
                changes.append(f"{key}={new['path']} changed since the run started ({old.get('size'):,} -> "
                               f"{new['size']:,} bytes, sha256 {str(old.get('sha256'))[:12]} -> {new['sha256'][:12]})")
    if changes and not allow:
        raise RunDirError(f"resuming {Path(run_path)}: {'; '.join(changes)}: the resumed run would train on other "
                          f"rows than its checkpoints saw. Put the file back, or set trainer.resume_changes=allow "
                          f"to go on with it as it is now")
    if fresh or changes or torn or not path.is_file():
        atomic_write_text(path, json.dumps(now, indent=1) + "\n")
    return changes
