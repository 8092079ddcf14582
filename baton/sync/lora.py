"""Adapter-only weight sync: a LoRA policy's adapter tensors into engines that serve it by name.

A LoRA run changes only its adapters, so only they move (for the 25M demo model at rank 8:
~2.5 MB instead of ~100 MB of full weights; `bench/lora_sync.py`):

    sync = LoraSync(engines, adapter_config, name="policy")
    sync.push(adapter_tensors(peft_model), version)   # PEFT keys: base_model.model.<m>.lora_A.weight

  - an in-process engine (`EmbeddedEngine.load_lora_adapter`) takes the tensors directly;
  - a server (`RemoteEngine`: baton serve, vLLM, SGLang) gets a PEFT adapter dir written
    atomically under `directory` (a filesystem the server sees), then
    `/load_lora_adapter` (vLLM: `/v1/load_lora_adapter`) after unloading the previous one
    of the same name (vLLM refuses to load over a loaded name; `baton serve` replaces it,
    and checks each tensor against the digests of what was written first: a mismatch is
    refused naming the tensor, the adapter loaded before keeps serving).
Requests then select the adapter with `SamplingParams(lora=name)`. A colocated engine over
the trainer's own peft module needs none of this: it reads the live adapters (`inplace`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

import torch

from baton.sync.digest import digests

def save_peft_dir(tensors: dict[str, torch.Tensor], config: dict, directory: Path) -> None:
    """PEFT's adapter layout (what vLLM / SGLang / peft load; `baton.models.lora` reads it)."""
    from safetensors.torch import save_file

    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


class LoraSync:
    def __init__(self, engines, adapter_config: dict, name: str = "policy",
                 directory: str | os.PathLike | None = None, keep_last: int = 1):
        self.engines = list(engines) if isinstance(engines, (list, tuple)) else [engines]
        self.config, self.name = dict(adapter_config), name
        self._own_dir = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="baton-lora-"))
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep_last = max(1, keep_last)
        self._written: list[Path] = []
        self.loaded = False
        self.last_bytes = 0  # tensor bytes moved by the last push (per engine)

    def push(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        tensors = {k: t.detach().to("cpu").contiguous() for k, t in named_params}
        if not tensors:
            raise ValueError("LoraSync.push got no adapter tensors")
        self.last_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
        path, sent = None, digests(tensors.items())
        for engine in self.engines:
            if engine.base_url is not None:  # a server: through a PEFT dir it can read, checked there
                path = path or self._write(tensors, version)
                if self.loaded and engine.dialect != "baton":  # baton's replaces it
                    engine.unload_lora_adapter(self.name)  # (so a refused load keeps the old one serving)
                engine.load_lora_adapter(self.name, str(path), digests=sent)
            else:
                engine.load_lora_adapter(self.name, (self.config, tensors))
            engine.version = version
        self.loaded = True

    def _write(self, tensors: dict[str, torch.Tensor], version: int) -> Path:
        final = self.directory / f"adapter-v{version}"
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=self.directory))
        try:
            save_peft_dir(tensors, self.config, tmp)
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if final not in self._written:  # a version written again (a refused push retried) is one dir
            self._written.append(final)
        while len(self._written) > self.keep_last + 1:  # the served one stays until the next load
            shutil.rmtree(self._written.pop(0), ignore_errors=True)
        return final

    def close(self) -> None:
        for p in self._written:
            shutil.rmtree(p, ignore_errors=True)
        self._written = []
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)
