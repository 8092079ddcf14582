"""`placement: auto`: choose devices, data-parallel ranks and threads from the machine.

A pure function of (cores, GPUs, model size, what the recipe set explicitly), so the choice
is the same for the same machine and config, and a resumed run (whose saved config has every
key set) keeps it. Every setting the recipe or the command line gave wins: `choose` only fills
what was left unset. It chooses *where and how fast*, never *what* is computed: it never sets
`trainer.mode` (whether rows are generated ahead is the recipe's choice), so a recipe trains
the same algorithm on every machine.

Rules (measured on the demo recipe, 2-core CPU, BENCHMARKS.md "placement: auto"):
- GPUs: one data-parallel rank per GPU (`placement.gpus_per_worker=1`; Ray when more than
  one), every role of a rank on its GPU, cores shared among the processes.
- 1 core: one process.
- >= 2 cores, a model of >= MIN_DP_PARAMS: one rank per core, one torch thread each:
  data parallelism splits both generation and the update.
- >= 2 cores, a smaller model (the demo's 0.82M): one process in the driver (no Ray): a rank's
  share of so small a model is too little work to pay for the processes and a collective per
  optimizer step.
  Ranks must divide the step's prompts and mini-batch: the largest such count <= cores.
- A recipe that generates ahead (`trainer.mode` one_step_off / async) runs its generator in a
  process of its own: one core is left to it (ranks <= cores - 1).
- Threads per process (`_threads`): one on a CPU machine for a model below MIN_DP_PARAMS (a
  second thread that spins at a barrier while its core runs other work stalls every op; ops
  this small gain little from it even on idle cores); otherwise the cores left idle per
  process, at least 1: cores / processes, less the cores the machine's other work keeps busy
  at start (`idle_cores`: `detect_idle_cores`, the load average and a 0.25 s sample of
  /proc/stat, whichever is busier). Measured (bench/threads.py, 2 cores, the demo recipe
  without its placement section): 2 threads a process were 2.6-30x slower than 1 under other
  work, and 8.3x at load 2-4, the quietest this machine was (BENCHMARKS.md "Threads").
- CPU memory (given `memory_bytes`): every CPU rank holds a whole replica (weights, gradients,
  AdamW's two moments in fp32, a reference, activations: ~RANK_BYTES_PER_PARAM a parameter),
  the generator a copy of the weights and its KV cache (~GENERATOR_BYTES_PER_PARAM); no more
  ranks than fit in MEMORY_FRACTION of the machine's memory (the Qwen2.5-0.5B shape on 2 cores
  and 24 GiB: 1 rank, where 2 ranks were killed by Ray's OOM monitor at 10.5 GB each).

A driver calls it after the config validated (`baton.trainers.algorithms.load_recipe`):
    cfg = load_config(cls, data=merged)                  # validated first: bad input is one line
    choice = choose(*detect_machine(), count_model_params(cfg.model.path),
                    view_from_config(cfg, explicit), memory_bytes=detect_memory(),
                    idle_cores=detect_idle_cores())
    print(choice.line())
    cfg = load_config(cls, data=merged + choice.overrides())   # only the keys auto decided
A resumed run reads its saved config, where every key is explicit: the choice is kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Below this many parameters one process trains (placement.auto never switches the recipe to
# generating ahead any more: round 4); from it on, every core holds a rank. The threshold sits
# between 2.2M and 4.8M: the measurements, round by round, are in BENCHMARKS.md ("placement.auto's
# threshold: the measurements behind MIN_DP_PARAMS").
MIN_DP_PARAMS = 4_000_000

# CPU memory per rank and for the generator, bytes per model parameter. A rank: fp32 weights,
# gradients and AdamW's two moments (16 B), a reference copy (4 B), x1.3 for activations and
# logits (measured: a 494M-parameter rank of bench/grpo_vs_trl.py peaked at 10.5 GB = 21 B a
# parameter without a reference). The generator: fp32 weights x1.5 for its KV cache.
RANK_BYTES_PER_PARAM = 26
GENERATOR_BYTES_PER_PARAM = 6
MEMORY_FRACTION = 0.8  # of the machine's memory, for the ranks and the generator together


AUTO_KEYS = ("placement.backend", "placement.world_size", "placement.threads_per_worker",
             "placement.gpus_per_worker")  # what `choose` may decide


@dataclass(frozen=True)
class AutoView:
    """What `choose` reads from a validated config: explicit settings (None: unset, auto
    decides), the recipe's trainer.mode and the batch sizes the ranks must divide."""

    auto: bool = True  # placement.auto=false: today's defaults for whatever is unset
    backend: str | None = None  # placement.backend
    world_size: int | None = None  # placement.world_size
    threads_per_worker: int | None = None  # placement.threads_per_worker
    gpus_per_worker: int | None = None  # placement.gpus_per_worker
    mode: str = "sync"  # the recipe's trainer.mode: read, never changed
    generator: bool = False  # the row source runs a generator process (baton.sources: SourceSpec.generator)
    prompts_per_step: int = 1
    rows_per_update: int = 0  # actor.mini_batch_size (0: the whole step's rows)
    has_pools: bool = False  # placement.pools / roles set: a hand-made placement, leave it alone


@dataclass(frozen=True)
class Choice:
    backend: str
    world_size: int
    threads_per_worker: int
    gpus_per_worker: int
    mode: str  # the recipe's trainer.mode, as it is
    reason: str
    decided: tuple[str, ...] = ()  # the keys auto set (the others were explicit)
    overlap: bool = False  # a generator runs ahead in a process of its own (the row source's)

    def overrides(self) -> list[str]:
        """Dotted overrides for the keys auto decided (explicit keys are not repeated)."""
        values = {"placement.backend": self.backend, "placement.world_size": self.world_size,
                  "placement.threads_per_worker": self.threads_per_worker,
                  "placement.gpus_per_worker": self.gpus_per_worker}
        return [f"{k}={values[k]}" for k in self.decided]

    def devices(self) -> str:
        """Where the roles run: `cuda:0` (one GPU), `cuda:0..3` (a rank per GPU), or `cpu`."""
        if not self.gpus_per_worker:
            return "cpu"
        return "cuda:0" if self.world_size == 1 else f"cuda:0..{self.world_size - 1} (one per rank)"

    def line(self) -> str:
        """The one line printed at start."""
        where = f"actor, rollout and every other role on {self.devices()}"
        if self.overlap:
            where += f"; trainer.mode={self.mode} (the recipe's): the generator in a process of its own"
        given = sorted(set(AUTO_KEYS) - set(self.decided))
        tail = f"; kept as set: {', '.join(given)}" if given and self.decided else ""
        return (f"placement auto: {self.world_size} rank(s) on {self.backend}, {self.threads_per_worker} "
                f"thread(s) each, {where} ({self.reason}{tail})")


def _divides(ws: int, view: AutoView) -> bool:
    rows = view.rows_per_update
    return view.prompts_per_step % ws == 0 and (rows == 0 or rows % ws == 0)


def _ranks(limit: int, view: AutoView) -> int:
    return max(w for w in range(1, max(1, limit) + 1) if _divides(w, view))


def _ranks_in_memory(model_params: int, memory_bytes: int | None, generator: bool) -> int | None:
    """How many CPU ranks (beside the generator, if any) fit in MEMORY_FRACTION of the memory."""
    if memory_bytes is None or model_params == 0:
        return None
    room = MEMORY_FRACTION * memory_bytes - (GENERATOR_BYTES_PER_PARAM * model_params if generator else 0)
    return max(0, int(room // (RANK_BYTES_PER_PARAM * model_params)))


def _cpu_ranks(cores: int, model_params: int, view: AutoView, memory_bytes: int | None) -> tuple[int, str]:
    """(ranks, why) on a CPU machine of `cores` >= 2 cores."""
    overlap = view.generator
    fit = _ranks_in_memory(model_params, memory_bytes, generator=overlap)
    room = cores - 1 if overlap else cores  # a generator ahead gets a core of its own
    cap = room if fit is None else max(1, min(room, fit))
    gen = "; one core left to the generator" if overlap else ""
    if view.world_size is not None:
        return view.world_size, f"{cores} cores, {view.world_size} rank(s) as set"
    if model_params < MIN_DP_PARAMS:
        return 1, (f"{cores} cores, {model_params / 1e6:.2f}M params < {MIN_DP_PARAMS / 1e6:g}M: one process (a rank's "
                   f"share of so small a model does not pay for its process){gen}")
    ws = _ranks(cap, view)
    if cap < room:
        why = (f"{cores} cores, {model_params / 1e6:.0f}M params: ~{RANK_BYTES_PER_PARAM * model_params / 2**30:.1f}"
               f" GiB a rank, {ws} rank(s) fit in {MEMORY_FRACTION:.0%} of {memory_bytes / 2**30:.0f} GiB"
               + (" (not even one does: consider model.lora, bf16 or more machines)" if fit == 0 else ""))
    elif ws == room:
        why = f"{cores} cores: one rank per core, each generating and updating its share"
    else:
        why = f"{cores} cores, but {view.prompts_per_step} prompts/step split into at most {ws} rank(s)"
    return ws, why + gen


def _threads(cores: int, gpus: int, procs: int, model_params: int, idle_cores: float | None) -> tuple[int, str]:
    """(torch threads a process, why) for `procs` processes on `cores` cores of which
    `idle_cores` are idle at start (None: all)."""
    share = max(1, cores // procs)
    if share == 1:
        return 1, ""
    if not gpus and model_params < MIN_DP_PARAMS:
        return 1, "; 1 thread: so small a model's ops gain little from more, and lose much on busy cores"
    idle = cores if idle_cores is None else max(0, min(cores, round(idle_cores)))
    if idle // procs < share:
        return max(1, idle // procs), f"; {cores - idle} of {cores} cores busy with other work at start"
    return share, ""


def choose(cores: int, gpus: int, model_params: int, view: AutoView, memory_bytes: int | None = None,
           idle_cores: float | None = None) -> Choice:
    """The placement for a machine with `cores` CPU cores (`idle_cores` of them idle at
    start; None: all), `gpus` GPUs and (CPU ranks only) `memory_bytes` of memory (None: not
    limited); see the module doc."""
    if cores < 1 or gpus < 0 or model_params < 0:
        raise ValueError(f"choose: cores >= 1, gpus >= 0, model_params >= 0 (got {cores}, {gpus}, {model_params})")
    if not view.auto or view.has_pools:
        why = "placement.auto=false" if not view.auto else "placement.pools/roles set by hand"
        return Choice(view.backend or "local", view.world_size or 1,
                      view.threads_per_worker if view.threads_per_worker is not None else 0,
                      view.gpus_per_worker or 0, view.mode, why, overlap=view.generator)
    gpw = view.gpus_per_worker if view.gpus_per_worker is not None else (1 if gpus else 0)
    if gpus >= 1 and gpw:
        ws = view.world_size or _ranks(max(1, gpus // gpw), view)
        why = f"{gpus} GPU(s): one rank per GPU"
    elif cores == 1:
        ws, why = view.world_size or 1, "1 core: one process"
    else:
        ws, why = _cpu_ranks(cores, model_params, view, memory_bytes)
    backend = view.backend or ("ray" if ws > 1 else "local")
    procs = ws + (1 if view.generator else 0)  # the generator is a process of its own
    threads, why_threads = _threads(cores, gpus if gpw else 0, procs, model_params, idle_cores)
    if view.threads_per_worker is not None:
        threads, why_threads = view.threads_per_worker, ""
    why += why_threads
    decided = tuple(k for k, v in (("placement.backend", view.backend), ("placement.world_size", view.world_size),
                                   ("placement.threads_per_worker", view.threads_per_worker),
                                   ("placement.gpus_per_worker", view.gpus_per_worker)) if v is None)
    return Choice(backend, ws, threads, gpw, view.mode, why, decided, overlap=view.generator)


def view_from_config(cfg: Any, explicit: set[str]) -> AutoView:
    """An AutoView from a validated config (built with placement.auto=false) and the dotted
    keys the recipe or the command line set (`explicit`): a placement key not among them is
    auto's to decide."""
    from baton.sources import source_spec

    p = cfg.placement

    def given(key: str) -> Any:
        return getattr(p, key.split(".")[1]) if key in explicit else None

    return AutoView(auto=True, backend=given("placement.backend"), world_size=given("placement.world_size"),
                    threads_per_worker=given("placement.threads_per_worker"),
                    gpus_per_worker=given("placement.gpus_per_worker"), mode=cfg.trainer.mode,
                    generator=source_spec(cfg).generator,  # as the row source registry says
                    prompts_per_step=cfg.data.prompts_per_step, rows_per_update=cfg.actor.mini_batch_size,
                    has_pools=bool({"placement.pools", "placement.roles"} & explicit))


def detect_memory() -> int:
    """The machine's physical memory in bytes: `choose`'s `memory_bytes` (the total, not what
    is free now, so that the choice is the same on every run of the machine)."""
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def detect_machine() -> tuple[int, int]:
    """(CPU cores this process may run on, CUDA GPUs visible): `choose`'s first two arguments."""
    import os

    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores, torch.cuda.device_count() if torch.cuda.is_available() else 0


def detect_idle_cores(window_s: float = 0.25) -> float:
    """Cores of this process's affinity that other work leaves idle now: `choose`'s
    `idle_cores`. The busier of two views: the 1-minute load average (spread over the host's
    CPUs, as a container sees the host's) and the idle share of each core over a `window_s`
    sample of /proc/stat (what the load average is slow to show)."""
    import os
    import time

    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    host = os.cpu_count() or len(cpus)
    idle = len(cpus) * max(0.0, 1.0 - os.getloadavg()[0] / host)

    def ticks() -> dict[int, tuple[int, int]]:  # cpu -> (idle + iowait, total) jiffies
        out = {}
        with open("/proc/stat") as f:
            for line in f:
                name, *vals = line.split()
                if name.startswith("cpu") and name[3:].isdigit():
                    v = [int(x) for x in vals]
                    out[int(name[3:])] = (v[3] + v[4], sum(v[:8]))
        return out

    try:
        a = ticks()
        time.sleep(window_s)
        b = ticks()
    except OSError:  # no /proc (macOS): the load average alone
        return idle
    sampled = sum((b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]) for c in cpus if c in a and c in b)
    return min(idle, sampled)


def count_model_params(path: str) -> int:
    """Parameters of the HF model at `path` (tied weights once), from its config alone: the
    model is built on the meta device, so nothing is allocated or read but config.json."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once
