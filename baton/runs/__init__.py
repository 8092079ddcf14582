"""Run directories and checkpoints that lose nothing.

A bottom layer (standard library + safetensors only, no other baton imports) that the
trainers and workers call:

  * `rundir`      - one run per run dir (`RunDirLock`), `prepare_run_dir` (refuse / resume /
                    overwrite), start-up cleanup of interrupted saves.
  * `ray_temp`    - stale Ray temp dirs of dead runs.
  * `checkpoints` - `atomic_dir` (a crash leaves the old or the new checkpoint, never
                    neither), completeness checks, the latest complete checkpoint, pruning.
  * `metrics_log` - reading `metrics.jsonl` despite a torn last line, `truncate_after` for
                    resume.
  * `fsutil`      - fsync helpers and atomic file writes.
"""

from baton.runs.checkpoints import (
    DEFAULT_REQUIRED, atomic_dir, check_checkpoint, checkpoint_step, is_complete,
    latest_complete_checkpoint, list_checkpoints, prune_checkpoints, recover_checkpoints,
)
from baton.runs.fsutil import atomic_write_bytes, atomic_write_text
from baton.runs.metrics_log import MetricsLogError, read_metrics, truncate_after
from baton.runs.ray_temp import find_stale_ray_temp_dirs, record_temp_dir_owner, remove_stale_ray_temp_dirs
from baton.runs.rundir import (
    PreparedRun, RunDirBusy, RunDirError, RunDirLock, cleanup_interrupted, prepare_run_dir,
)

__all__ = [
    "DEFAULT_REQUIRED", "MetricsLogError", "PreparedRun", "RunDirBusy", "RunDirError", "RunDirLock",
    "atomic_dir", "atomic_write_bytes", "atomic_write_text", "check_checkpoint", "checkpoint_step",
    "cleanup_interrupted", "find_stale_ray_temp_dirs", "is_complete", "latest_complete_checkpoint",
    "list_checkpoints", "prepare_run_dir", "prune_checkpoints", "read_metrics", "record_temp_dir_owner",
    "recover_checkpoints", "remove_stale_ray_temp_dirs", "truncate_after",
]
