"""What `baton tinker` holds: the served base model, sessions, training models (`Trainee`s),
samplers (`Samplers`) and checkpoints, and the calls the routes queue on the worker thread.

Names and paths, as the hosted Tinker service gives them:
    session            "session-<hex>"
    training model     "<session>:train:<model_seq_id>"    (what the SDK derives for load_weights)
    sampler            "<session>:sample:<seq>"
    checkpoint         "tinker://<model_id>/weights/<name>"          save_state / load_state
                       "tinker://<model_id>/sampler_weights/<name>"  save_weights_for_sampler
Checkpoints are PEFT adapter dirs under `state_dir/<model_id>/<kind>/<name>` (`baton export
--merge` turns one into a plain model); a name is letters, digits, `.`, `_`, `-`.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import torch

from baton.models.lora import read_adapter
from baton.protocol import SamplingParams
from baton.tinker.futures import UserError
from baton.tinker.sampler import Samplers
from baton.tinker.trainee import Trainee, lora_targets
from baton.tinker.wire import ForwardBackward

PATH = re.compile(r"^tinker://(?P<model>[A-Za-z0-9:._-]+)/(?P<kind>weights|sampler_weights)/(?P<name>[A-Za-z0-9._-]+)$")
NAME = re.compile(r"^[A-Za-z0-9._-]{1,128}$")


class TinkerService:
    def __init__(self, model_dir: Path, names: list[str], tokenizer: Any, engine: Any, state_dir: Path,
                 *, max_models: int = 4, max_adapters: int = 16, context_len: int = 2048,
                 max_sample_tokens: int = 1024, dtype: torch.dtype = torch.float32):
        self.model_dir, self.names, self.tokenizer = model_dir, names, tokenizer
        self.samplers = Samplers(engine, max_adapters)
        self.state_dir, self.max_models, self.context_len = state_dir, max_models, context_len
        self.max_sample_tokens, self.dtype = max_sample_tokens, dtype
        self.sessions: set[str] = set()
        self.trainees: dict[str, Trainee] = {}
        self.sampler_sources: dict[str, tuple[str | None, str | None]] = {}  # id -> (adapter name, model_path)
        self.snapshots = 0

    # --- names ---------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.names[0]

    def new_session(self) -> str:
        session = f"session-{uuid.uuid4().hex[:12]}"
        self.sessions.add(session)
        return session

    def checkpoint_dir(self, path: str) -> tuple[str, str, Path]:
        m = PATH.match(path)
        if m is None:
            raise UserError(f"checkpoint path {path!r} is not tinker://<model_id>/(weights|sampler_weights)/<name>")
        return m["model"], m["kind"], self.state_dir / m["model"].replace(":", "_") / m["kind"] / m["name"]

    def checkpoint_path(self, model_id: str, kind: str, name: str | None) -> str:
        if name is None:
            self.snapshots += 1
            name = f"snapshot-{self.snapshots:06d}"
        if not NAME.match(name):
            raise UserError(f"checkpoint name {name!r}: letters, digits, '.', '_' and '-' only (at most 128)")
        return f"tinker://{model_id}/{kind}/{name}"

    # --- training (on the worker thread) ---------------------------------------------------
    def create_model(self, model_id: str, rank: int, seed: int | None, targets: list[str]) -> dict:
        if model_id in self.trainees:
            return {"model_id": model_id, "type": "create_model"}
        if len(self.trainees) >= self.max_models:
            raise UserError(f"this server trains at most {self.max_models} models at once (--max-models); "
                            f"unload one or restart it")
        self.trainees[model_id] = Trainee(model_id, str(self.model_dir), rank, targets, seed or 0, dtype=self.dtype)
        return {"model_id": model_id, "type": "create_model"}

    def info(self, model_id: str) -> dict:
        t = self.trainees[model_id]
        return {"type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": t.rank,
                "model_name": self.name, "optimizer_config": {"type": "adamw"},
                "model_data": {"arch": type(t.model.get_base_model()).__name__, "model_name": self.name,
                               "tokenizer_id": str(self.model_dir)}}

    def forward_backward(self, request: ForwardBackward, cfg: dict[str, float]):
        return self.trainees[request.model_id].forward_backward(request.data, request.loss_fn, cfg,
                                                                request.forward_only)

    def optim_step(self, model_id: str, adam: dict[str, float]) -> dict:
        return {"metrics": self.trainees[model_id].optim_step(adam)}

    def save_for_sampler(self, model_id: str, path: str | None, sampler_id: str | None) -> dict:
        """A snapshot of the adapters: served at once as sampler `sampler_id` (the SDK's
        save_weights_and_get_sampling_client), or written to `path` (save_weights_for_sampler)."""
        t = self.trainees[model_id]
        if sampler_id is not None:
            config, tensors = t.snapshot()
            self.samplers.add(sampler_id, config, tensors)
            self.sampler_sources[sampler_id] = (sampler_id, None)
            return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}
        _, _, directory = self.checkpoint_dir(path)
        t.save(directory, optimizer=False)
        return {"path": path, "type": "save_weights_for_sampler"}

    def save_state(self, model_id: str, path: str) -> dict:
        self.trainees[model_id].save(self.checkpoint_dir(path)[2], optimizer=True)
        return {"path": path, "type": "save_weights"}

    def load_state(self, model_id: str, path: str, optimizer: bool, create: bool) -> dict:
        _, kind, directory = self.checkpoint_dir(path)
        if not directory.is_dir():
            raise UserError(f"no checkpoint at {path}")
        if create:
            config, _ = read_adapter(directory)
            modules = set(config.get("target_modules") or [])
            self.create_model(model_id, int(config["r"]), 0,
                              lora_targets(bool(modules & {"q_proj"}), bool(modules & {"gate_proj"}),
                                           "lm_head" in modules))
        try:
            self.trainees[model_id].load(directory, optimizer)
        except (ValueError, KeyError) as e:
            raise UserError(f"load_state {path}: {e}") from e
        return {"path": path, "model_id": model_id, "type": "load_weights"}

    # --- sampling --------------------------------------------------------------------------
    def open_sampler(self, sampler_id: str, model_path: str | None) -> None:
        """A sampler of the base model (model_path None) or of a sampler checkpoint on disk."""
        if model_path is None:
            self.sampler_sources[sampler_id] = (None, None)
            return
        _, kind, directory = self.checkpoint_dir(model_path)
        if not directory.is_dir():
            raise UserError(f"no checkpoint at {model_path}")
        self.samplers.add(sampler_id, *read_adapter(directory))
        self.sampler_sources[sampler_id] = (sampler_id, model_path)

    def sample(self, sampler_id: str, prompt: list[int], n: int, params: SamplingParams,
               prompt_logprobs: bool) -> tuple[list, list[float] | None]:
        adapter, _ = self.sampler_sources[sampler_id]
        if not self.samplers.has(adapter):
            raise UserError(f"sampler {sampler_id} was dropped (more than {self.samplers.max_adapters} samplers "
                            "loaded since); save the weights for the sampler again")
        params.n = n
        sequences = self.samplers.sample(adapter, prompt, params)
        return sequences, self.samplers.prompt_logprobs(adapter, prompt) if prompt_logprobs else None
