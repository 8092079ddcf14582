"""How many KV-cache tokens a `generate` call may hold at once: from a fixed budget
(`rollout.max_batch_tokens`, `baton serve --max-batch-tokens`) or from the memory the device
has left after the weights (`rollout.memory_fraction`, as vLLM's `gpu_memory_utilization` /
SGLang's `mem_fraction_static`, but a fraction of what is *free* when the call starts: a
colocated trainer's weights, gradients and optimizer state are already counted out).

A group of prompts decodes together when rows * (prompt + max_new + row_tokens) <= budget,
where `row_tokens` is a row's sampling memory (its [vocab] logits and the sampler's fp32
passes over them) in KV-token units; a fixed budget counts KV tokens only (row_tokens 0), as
it always did. Groups are cut from the prompts sorted by length (`group_prompts`), so the
same budget gives the same groups, and the same tokens for a seed.

Free memory: on a GPU the driver's free bytes (`torch.cuda.mem_get_info`) plus what torch's
caching allocator holds unused; on a CPU the machine's available memory (psutil).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

MEMORY_FRACTION = 0.8  # of the free memory, when neither key is given
SAMPLER_PASSES = 8  # fp32 [vocab] buffers a row's sampling holds at once (logits, scaled, log_softmax, probs, cdf, ...)


def free_memory(device: torch.device) -> int:
    """Bytes still free for this process on `device`."""
    import torch

    if device.type == "cuda":  # CUDA only: not run on a CPU (tests/gpu/test_engine_cuda.py)
        free, _ = torch.cuda.mem_get_info(device)
        return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))
    import psutil

    return int(psutil.virtual_memory().available)


def kv_bytes_per_token(config: Any, dtype: torch.dtype) -> int:
    """K and V of every layer for one token, from an HF config."""
    import torch

    heads = getattr(config, "num_attention_heads", None) or 1  # unknown: K and V as wide as the hidden state
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    item = torch.empty(0, dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * kv_heads * head_dim * item


def token_budget(free_bytes: int, fraction: float, kv_bytes: int, vocab: int) -> tuple[int, int]:
    """(KV tokens, row_tokens) a call may use out of `free_bytes` at `fraction`: see the module
    docstring. row_tokens: a row's sampling memory in KV-token units."""
    row_tokens = -(-SAMPLER_PASSES * 4 * vocab // kv_bytes)  # ceil
    return int(free_bytes * fraction) // kv_bytes, row_tokens


def group_prompts(lengths: list[int], n: int, max_new: int, budget: int, row_tokens: int = 0) -> list[list[int]]:
    """Prompt indices, sorted by length, cut so each group's rows * (its longest prompt +
    max_new + row_tokens) fits `budget` (a prompt too long for it alone gets a group of its own)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    groups: list[list[int]] = []
    current: list[int] = []
    for i in order:  # lengths ascend, so the newest prompt is the group's longest
        rows = (len(current) + 1) * n
        if current and rows * (lengths[i] + max_new + row_tokens) > budget:
            groups.append(current)
            current = []
        current.append(i)
    if current:
        groups.append(current)
    return groups


def check_budget_options(max_batch_tokens: int | None, memory_fraction: float | None) -> None:
    """One line of error for a bad pair (the config's and the engine's check)."""
    if max_batch_tokens is not None and memory_fraction is not None:
        raise ValueError("give rollout.max_batch_tokens (a fixed KV budget) or rollout.memory_fraction "
                         "(a share of the free memory), not both")
    if max_batch_tokens is not None and max_batch_tokens < 1:
        raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
    if memory_fraction is not None and not 0.0 < memory_fraction <= 1.0:
        raise ValueError(f"memory_fraction must be in (0, 1], got {memory_fraction}")
