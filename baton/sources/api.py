"""`ApiSource`: a step's rows pulled from the trajectory API (`data.source: api`); registered
as "api" in `baton.sources.SOURCES`.

    baton api --port 8000 &  baton serve MODEL --port 8001 &
    baton env arithmetic --api http://127.0.0.1:8000 --server http://127.0.0.1:8001 &
    baton train recipes/grpo_arithmetic_api.yaml      (or all at once: baton launch RECIPE)

The trainer registers with the API as an Atropos trainer does (`/register`: batch size =
data.prompts_per_step x rollout.n sequences, max token length, checkpoint dir and interval,
starting step, number of steps, + baton's `max_staleness`), then each step:

  rows(step)   GET /batch?version=V&max_staleness=S until a batch is there (V = the trainer's
               weight version). While it waits it says what for, every 10 s: sequences
               queued of the batch size, environments registered / alive, stale groups; it
               re-pushes weights to any server that lost them (restarted), and rides out an
               API restart (retried with backoff: the API's queue is on disk). The groups
               become the step's rows (group-major: the n sequences of a group are adjacent):
                 tokens + masks  -> prompt = the tokens before the first trained token
                                    (mask != -100), response = the rest, response_mask =
                                    mask != -100 (tokens an environment added mid-response,
                                    e.g. tool output, are not trained)
                 inference_logprobs -> rollout_logprobs (the behaviour policy's); a group
                                    without them gets the trainer's own (an on-policy guess)
                 scores          -> rewards (the driver skips its reward role: the
                                    environment scored the group)
                 policy_version  -> policy_version per row (policy age is logged)
                 group_id        -> the run's ledger (baton.trainers.session.ledger)
               Delivery is tied to checkpoints: each request acknowledges the batches the
               newest checkpoint trained (`ack`) and says which this trainer holds
               (`after`); `checkpointed(step)` acknowledges at once (POST /ack). A trainer
               killed anywhere resumes from its checkpoint, whose `batch_id` says what it
               trained: the batches handed out since are served again (same groups, in
               order), those it acknowledged never (docs/RELIABILITY.md).
  weights_updated(version)
               every `data.sync_every` steps, push the actor's weights to the `baton serve`
               processes in `data.servers` (`ServerSyncWorker`, colocated with the actor;
               `rollout.weight_sync`: auto = broadcast, or checkpoint), bumping their version; with
               trainer.check_weight_sync the parity check runs on each server.
  sync_metrics()
               right after weights_updated: sync/bytes, sync/seconds, sync/tensors of the
               push made this step (0 on a step without one), sync/verified (every server in
               data.servers holds, by content, the weights last pushed: checked after each push,
               `ServerSyncWorker.verify`; between pushes the last check's answer) and
               sync/lag_steps (updates the served weights are behind the trainer's: 0 on a push
               step, up to data.sync_every - 1). A 0 names the server and tensor in a warning.

Group sizes must equal rollout.n (the advantage estimator's group); a group of another
size is an error naming its environment.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Any


from baton import fields as F
from baton.batch import Batch
from baton.controller import colocated_groups
from baton.runs.checkpoints import CHECKPOINTS_DIR
from baton.services.client import APIClient
from baton.services.groups import groups_to_batch
from baton.sources.base import Prompts
from baton.workers.server_sync import ServerSyncWorker

log = logging.getLogger("baton.sources.api")
WAIT_REPORT_S = 10.0  # how often a waiting trainer says what it waits for
ENSURE_EVERY_S = 5.0  # how often a waiting trainer checks the servers' weight versions


def _model_limit(model_path: str, key: str, default: int | None) -> int | None:
    """`key` of the model's config.json (max_position_embeddings, vocab_size), else `default`."""
    try:
        with open(os.path.join(model_path, "config.json")) as f:
            value = json.load(f).get(key)
            return int(value) if value else default
    except (OSError, ValueError):
        return default


class ApiSource:
    """Rows from `baton api` (see the module docstring). `actor`: the actor group (the
    server-sync role is colocated with it; logprobs for groups that carry none)."""

    def __init__(self, cfg: Any, actor: Any, state: Prompts, probe_prompt: str, tokenizer: Any = None):
        d, t = cfg.data, cfg.trainer  # trainer.mode is sync: the spec says sync_only, the config check refuses others
        self.cfg, self.actor, self.state = cfg, actor, state
        self.group_size = cfg.rollout.n
        self.batch_size = d.prompts_per_step * cfg.rollout.n
        self.max_staleness = cfg.trainer.max_staleness  # None: no bound
        self.sync_every, self.wait_s = d.sync_every, d.api_wait_s
        if tokenizer is None:
            from baton.models.load import load_tokenizer
            tokenizer = load_tokenizer(cfg.model.path)
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.client = APIClient(d.api_url, token=os.environ.get("BATON_API_TOKEN") or None, retry_for_s=None,
                                name="trainer")
        self.stale_groups = 0
        # delivery tied to checkpoints: `held` the batch_id of the last batch received, `acked`
        # the one the newest written checkpoint trained (every batch up to it acknowledged)
        self.held = self.acked = 0
        # group_size / vocab_size: the API refuses (422) pushes this trainer could not train on
        self.client.register(batch_size=self.batch_size, max_token_len=_model_limit(cfg.model.path,
                                                                                     "max_position_embeddings", 2048),
                             group_size=self.group_size, vocab_size=_model_limit(cfg.model.path, "vocab_size", None),
                             checkpoint_dir=os.path.join(t.run_dir, CHECKPOINTS_DIR),
                             save_checkpoint_interval=t.save_every, starting_step=state.step, num_steps=t.steps,
                             wandb_group=os.path.basename(os.path.normpath(t.run_dir)), wandb_project="baton",
                             max_staleness=self.max_staleness)
        self.servers = None
        if d.servers:
            kw = dict(kind=cfg.rollout.weight_sync, probe_prompt=probe_prompt, api_key=os.environ.get("BATON_API_KEY") or None,
                      weights_dir=d.weights_dir or None)
            self.servers = colocated_groups(actor.pool, {"server_sync": (ServerSyncWorker, (list(d.servers),), kw)})[
                "server_sync"]
            self.servers.push(state.step)  # the servers start from the trainer's weights, whatever they loaded
        self.pushed = self.version = state.step  # the version the servers serve; the trainer's
        self._verify_due, self._verified = self.servers is not None, math.nan  # sync/verified of the last push
        self._last_ensure = time.monotonic()

    # --- the seam -------------------------------------------------------------------------
    def rows(self, step: int) -> Batch:
        version = step - 1  # the weights the trainer has now
        t0 = last_report = time.monotonic()
        while True:
            # ack: what the newest checkpoint trained (again: a trainer killed after writing it,
            # before its POST /ack); after: the batches this trainer holds. A batch handed out
            # since that checkpoint (a trainer killed before the next) is served again, in order
            out = self.client.batch(version=version, max_staleness=self.max_staleness, ack=self.acked,
                                    after=self.held)
            self.stale_groups += int(out.get("stale_groups") or 0)
            if out.get("batch") is not None:
                self.held = int(out.get("batch_id") or 0)
                batch = groups_to_batch(out["batch"], self.tokenizer, self.pad_id, self.group_size)
                batch.meta[F.LEDGER_IDS] = [f"g:{g.get('group_id')}" for g in out["batch"]]  # the run's ledger
                if F.ROLLOUT_LOGPROBS not in batch:  # the environment kept no logprobs: the trainer's own
                    batch[F.ROLLOUT_LOGPROBS] = self.actor.compute_logprobs(batch).get()[F.OLD_LOGPROBS]
                return batch
            now = time.monotonic()
            if self.servers is not None and now - self._last_ensure > ENSURE_EVERY_S:
                if self.servers.ensure(self.pushed)[0]:  # a restarted server gets the weights again
                    self._verify_due = True
                self._last_ensure = now
            if now - last_report > WAIT_REPORT_S:
                log.warning("step %d: %s", step, self.waiting_for())
                last_report = now
            if self.wait_s and now - t0 > self.wait_s:
                raise TimeoutError(f"step {step}: no batch from {self.client.url} in {self.wait_s:g} s "
                                   f"(data.api_wait_s): {self.waiting_for()}")
            time.sleep(0.1)

    def waiting_for(self) -> str:
        """What the trainer waits for, in words (from the API's /status)."""
        s = self.client.status()
        envs = s.get("envs") or []
        alive = [e for e in envs if e.get("alive")]
        text = (f"waiting for a batch of {self.batch_size} sequences from {self.client.url}: "
                f"{s.get('queued_sequences', 0)} queued ({s.get('queued_groups', 0)} groups), "
                f"{s.get('stale_groups', 0)} stale; {len(alive)} of {len(envs)} environments alive")
        if not alive:
            text += " - start one: baton env NAME --api URL --server URL"
        else:
            text += " (" + ", ".join(f"{e['name']} last heard {e['last_seen_s']:.0f} s ago" for e in alive) + ")"
        return text

    def weights_updated(self, version: int, check: bool = False) -> list[float] | None:
        self.version = version
        if self.servers is None:
            return [0.0] if check else None
        if version - self.pushed < self.sync_every and version >= self.pushed and not check:
            return None  # every K steps (a resumed run pushes at once: its version jumped)
        self._verify_due = True
        parity = self.servers.push(version, check)[0]
        self.pushed = version
        return parity if check else None

    def sync_metrics(self) -> dict[str, float]:
        """The step's sync/* (see the module docstring); {} without data.servers."""
        if self.servers is None:
            return {}
        moved = {"sync/bytes": 0.0, "sync/seconds": 0.0, "sync/tensors": 0.0}
        if self._verify_due:
            self._verify_due = False
            checked, problem = self.servers.verify()[0]
            self._verified = checked["sync/verified"]
            if problem is not None:
                log.warning("weights version %d: sync/verified=%g: %s", self.pushed, self._verified, problem)
            if self.pushed == self.version:
                moved.update({k: v for k, v in checked.items() if k in moved})
        return {**moved, "sync/verified": self._verified, "sync/lag_steps": float(self.version - self.pushed)}

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:  # the queue itself lives in the API's store
        return {"stale_groups": self.stale_groups, "batch_id": self.held}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.stale_groups = int(state.get("stale_groups", 0))
        self.held = self.acked = int(state.get("batch_id", 0))  # the batches since are served again

    def checkpointed(self, step: int) -> None:
        """The checkpoint holding every batch received so far is written: acknowledge them
        (never served again). A trainer killed before this resumes from that checkpoint and
        acknowledges them with its first request."""
        if self.held > self.acked:
            self.client.ack(self.held)
            self.acked = self.held

    def close(self) -> None:
        self.client.close()
        if self.servers is not None:
            try:
                self.servers.close_sync()
            finally:
                self.servers.shutdown()


def build(cfg: Any, roles: dict[str, Any], state: Any) -> ApiSource:
    """The trajectory API's source for `cfg` (data.source: api); probes with the first eval prompt."""
    return ApiSource(cfg, roles["actor"], state, probe_prompt=state.eval_rows[0]["prompt"])
