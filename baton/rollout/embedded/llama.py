"""Fast forward pass for Llama-family HF models (Llama incl. Llama-3's rope scaling, Qwen2,
Qwen3, Mistral, and the mixtures of experts Qwen3-MoE and Mixtral, whose sparse MLPs run in
`moe.py`: FAMILIES), with a preallocated KV cache.

HF's own forward spends much of a small model's decode step in Python and in growing its
cache (a `torch.cat` per layer per step). This runner reads the *same* weight tensors
and runs a lean forward:

  * one static KV cache per layer, [rows, kv_heads, prompt_len + max_new, head_dim],
    with left-padded prompts, so every row writes its next token to the same slot;
  * prefill in chunks of similar-length prompts (the engine sorts by length), each padded
    only to its own longest prompt, so short prompts do not pay for the longest one;
  * RMSNorm (one kernel, `kernels.rms_norm`), RoPE (the model's own inv_freq / attention
    scaling, computed exactly as HF does; in decode one `bmm` for all q and k heads,
    `kernels.rope_matrices`), GQA, SiLU-gated MLP, optional q/k/v (Qwen2) and o/MLP
    (Llama) biases, Qwen3's per-head q/k RMSNorm, Mistral's sliding window (a window
    shorter than the cache masks the older slots);
  * decode attention treats the query heads of one KV group as the "query length"
    ([rows, kv_heads, group, head_dim]), so GQA needs no expanded K/V;
  * residual adds fused into the output matmuls (`addmm`); in prefill RoPE as roll + addcmul.

Weights: with `fuse=True` (default) `pack()` builds, from the live parameters, fused and
transposed copies ([in, out] contiguous: Q|K|V and gate|up in one matmul each; measured
faster than `functional.linear` on the [out, in] layout on this CPU). The engine calls `pack()` at
the start of every `generate`, so the copies can never be stale - an optimizer step on a
colocated trainer module is seen by the next `generate`; generations in flight together
(`baton serve`'s interleaving) share one copy (`pack(reuse=True)`), dropped by a weight update
or once the last of them ends (`unpack`). `fuse=False` reads the parameters
directly (transposed views, no copy) for models where a second copy does not fit; where
Q, K and V (gate and up) lie back to back in one buffer, as `fuse_storage` lays out a model
the engine owns (a copy that weight sync fills), they are still one matmul, over a view.

LoRA: `pack(lora)` takes {module path: (A [r, in], B [out, r], scale)} (the live adapters
of a colocated peft policy, or an adapter the engine serves by name) and reads each
wrapped linear's `base_layer`. With `fuse=True` the adapter is merged into the fused copy
that is built anyway (W + scale * B @ A, no extra memory); with `fuse=False` the base
weights are read in place and each adapted matmul adds scale * (x @ A^T) @ B^T (two
rank-r matmuls, no merged copy of anything). Adapters of another dtype than their base (peft's
fp32 over a bf16 base) are cast to the base's first: a copy of the rank-r factors per pack.
"""

from __future__ import annotations

import torch
from torch.nn import functional
from torch import nn

from baton.padding import position_ids
from baton.rollout.embedded.kernels import half_roll, rms_norm, rope_matrices
from baton.rollout.embedded.moe import Experts, expert_pieces, experts_of, moe_forward

FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "qwen3_moe", "mixtral")  # model_type values with a fast path
WINDOWED = ("mistral", "mixtral", "qwen3_moe")  # one sliding window (config.sliding_window) for every layer
_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # inv_freq does not depend on length
ROPE = ("cos", "sin", "cs", "eye", "roll")  # the RoPE tables' attributes (`LlamaRunner.rope_tables`)
ONE_PASS_TOKENS = 32768  # a one-pass prefill's chunk (padded tokens): ~0.6 GB of bf16 MLP activations at 0.5B


def supports(model: nn.Module) -> bool:
    """True when `model` is a plain (unwrapped, unquantized) causal LM of FAMILIES, with
    full attention in every layer (Mistral's one window for all layers included); anything
    else (other families, Qwen2/3 with sliding-window layers, other activations or RoPE
    kinds, quantized linears) runs through its HF forward (`baton.rollout.embedded.hf`)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in FAMILIES:
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False  # sliding-window layers: leave to HF
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in _STATIC_ROPE:
        return False
    linears = [model.lm_head]
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj]
        if experts_of(m) is None:
            linears += [m.gate_proj, m.up_proj, m.down_proj]
        elif not isinstance(getattr(m.experts, "gate_up_proj", None), nn.Parameter) or _base(m.experts) is not m.experts:
            return False  # experts of another layout, or adapted (peft's parameter LoRA): HF path
    return all(type(_base(m)) is nn.Linear for m in linears)  # quantized wrappers: HF path


def _base(m: nn.Module) -> nn.Module:
    """A LoRA-wrapped linear's base layer (peft keeps the original nn.Linear there)."""
    return m.base_layer if hasattr(m, "lora_A") and hasattr(m, "base_layer") else m


Lora = dict[str, tuple[torch.Tensor, torch.Tensor, float]]  # path -> (A [r, in], B [out, r], scale)


def _joint(ts: list[torch.Tensor]) -> torch.Tensor | None:
    """One view over contiguous tensors of one shape but the first dim that lie back to back
    in one storage (`fuse_storage`'s layout), in order; None if they do not."""
    first = ts[0]
    offset, rows = first.storage_offset(), 0
    for t in ts:
        if (not t.is_contiguous() or t.dtype != first.dtype or t.shape[1:] != first.shape[1:]
                or t.untyped_storage().data_ptr() != first.untyped_storage().data_ptr()
                or t.storage_offset() != offset):
            return None
        offset, rows = offset + t.numel(), rows + t.shape[0]
    return first.detach().as_strided((rows, *first.shape[1:]), first.stride())


def fuse_storage(model: nn.Module) -> None:
    """Lay each layer's Q, K, V weights (biases) back to back in one buffer, and gate / up's,
    the parameters becoming views of it: values unchanged; the fast path's `fuse=False` then
    runs each group as one matmul with no packed copy. For a model the engine owns (weight
    sync copies into its parameters in place); never the trainer's own module. A no-op where
    the layout is already so; `sleep` / `wake` that reallocate parameters undo it (call again)."""
    with torch.no_grad():
        for layer in model.model.layers:
            a, m = layer.self_attn, layer.mlp
            mlp = [[m.gate_proj, m.up_proj]] if experts_of(m) is None else []  # stacked experts: one buffer already
            for group in ([a.q_proj, a.k_proj, a.v_proj], *mlp):
                for attr in ("weight", "bias"):
                    params = [getattr(_base(x), attr) for x in group]
                    if any(p is None for p in params) or _joint([p.data for p in params]) is not None:
                        continue
                    buf, start = torch.cat([p.data for p in params]), 0
                    for p in params:
                        p.data, start = buf[start:start + p.shape[0]], start + p.shape[0]


def _linear_pieces(mods: list[nn.Module], fuse: bool, paths: list[str] | None = None,
                   lora: Lora | None = None, into: list[tuple] | None = None) -> list[tuple]:
    """[(weight^T [in, out], bias, low-rank term | None)] - one fused contiguous piece (LoRA
    merged into it), or a view per module (LoRA as (A^T [in, r], B^T [r, out], scale)), or
    one view over them all where they lie back to back (`fuse_storage`) and no LoRA.
    into: an earlier fused piece of these modules, refilled in place when its layout fits
    (the same addresses: a CUDA graph over them stays valid)."""
    mods = [_base(m) for m in mods]
    # the adapters in their base weight's dtype: peft keeps them fp32 over a bf16 base (a GPU's
    # frozen base, `precision.weights_dtype`), and a matmul takes one dtype (a copy of r rows then)
    adapters = [None if ad is None else (ad[0].to(m.weight.dtype), ad[1].to(m.weight.dtype), ad[2])
                for m, ad in zip(mods, [lora.get(p) if lora and paths else None for p in (paths or [None] * len(mods))])]
    joint = _joint([m.weight for m in mods]) if not fuse and len(mods) > 1 and not any(adapters) else None
    if joint is not None:
        return [(joint.t(), _joint_bias(mods), None)]
    if not fuse:
        return [(m.weight.t(), m.bias, None if ad is None else (ad[0].t(), ad[1].t(), ad[2]))
                for m, ad in zip(mods, adapters)]
    weights = [m.weight if ad is None else torch.addmm(m.weight, ad[1], ad[0], alpha=ad[2])
               for m, ad in zip(mods, adapters)]  # W + scale * B @ A
    wt = torch.cat(weights).t()  # [in, sum(out)]
    bias = None if all(m.bias is None for m in mods) else torch.cat(  # a copy: `into` is refilled in place
        [m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in mods])
    if into is not None and len(into) == 1 and into[0][0].shape == wt.shape and into[0][0].dtype == wt.dtype \
            and (into[0][1] is None) == (bias is None):
        into[0][0].copy_(wt)
        if bias is not None:
            into[0][1].copy_(bias)
        return into
    return [(wt.contiguous(), bias, None)]


def _joint_bias(mods: list[nn.Module]) -> torch.Tensor | None:
    """The modules' biases as one [sum(out)] (zeros for a module without): a view where they
    lie back to back, else a copy; None if none has a bias."""
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return None
    joint = _joint(biases) if all(b is not None for b in biases) else None
    return joint if joint is not None else torch.cat(
        [b if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(mods, biases)])


def _mm(x: torch.Tensor, pieces, residual: torch.Tensor | None = None) -> torch.Tensor:
    """x [N, in] @ pieces (+ bias) (+ residual, fused into the matmul). Returns [N, out]."""
    outs = []
    for wt, bias, low in pieces:
        if residual is not None:
            y = torch.addmm(residual, x, wt)
            y = y if bias is None else y.add_(bias)
        else:
            y = x @ wt if bias is None else torch.addmm(bias, x, wt)
        if low is not None:  # LoRA, unmerged: + scale * (x @ A^T) @ B^T
            y = y.addmm_(x @ low[0], low[1], alpha=low[2])
        outs.append(y)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)


class LlamaRunner:
    """Prefill / decode over a static KV cache for one `generate` call at a time."""

    def __init__(self, model: nn.Module, fuse: bool = True, prefill_chunk_tokens: int = 4096):
        self.model = model
        self.fuse = fuse
        self.prefill_chunk_tokens = prefill_chunk_tokens
        cfg = model.config
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.group = self.n_heads // self.n_kv
        self.scale = attn.scaling
        self.eps = model.model.norm.variance_epsilon
        self.qk_norm = hasattr(attn, "q_norm")  # Qwen3: RMSNorm of each q / k head before RoPE
        self.qk_eps = attn.q_norm.variance_epsilon if self.qk_norm else None
        # Mistral: a query at cache slot s sees slots s - window + 1 .. s (HF's overlay
        # `kv_idx > q_idx - sliding_window`); None: no window
        self.window = getattr(cfg, "sliding_window", None) if cfg.model_type in WINDOWED else None
        self.route_log: list[torch.Tensor] | None = None  # `record_routing`: each MoE layer's experts, per call
        self.moe_layers = sum(experts_of(layer.mlp) is not None for layer in model.model.layers)
        self.layers: list[tuple] = []
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._packs: dict[int, tuple] = {}  # id(lora) -> (lora, packed attributes): kept for reuse
        self._spare: dict | None = None  # the last fused copy, refilled in place by the next pack once unpacked

    # --- weights ---------------------------------------------------------------------
    PACKED = ("layers", "norm_w", "embed", "lm_head", "inv_freq", "rope_scaling")  # what pack() sets
    SHARED = frozenset({"_packs", "_spare"})  # the runner's own, not a generation's (`Generation` leaves them)

    def pack(self, lora: Lora | None = None, reuse: bool = False) -> None:
        """Collect (and fuse) the weights the forward uses, from the live parameters, with
        the LoRA adapter `lora` applied (see the module docstring). reuse=True: take those
        of an earlier pack with the same adapter if still kept (`unpack` drops them): the
        generations in flight share one fused copy. Once unpacked (no generation reads the
        last fused copy any more: `forget` drops it where one might), the fused weights are
        written into that copy in place, keeping their addresses (CUDA graphs over them stay valid)."""
        kept = self._packs.get(id(lora)) if reuse else None
        if kept is not None and kept[0] is lora:
            vars(self).update(kept[1])
            return
        self._pack(lora, self._spare if not self._packs and self.fuse else None)
        self._packs[id(lora)] = (lora, {k: getattr(self, k) for k in self.PACKED})
        self._spare = {"layers": self.layers, "lm_head": self.lm_head}

    def forget(self) -> None:
        """Drop the packed weights and the fused copy kept for refilling: its memory (sleep),
        or a weight update while generations in flight still read it."""
        self._packs, self._spare = {}, None

    def unpack(self) -> None:
        """Drop the packed weights kept for reuse (after a weight update, or once no
        generation is in flight): the next `pack` reads the parameters afresh."""
        self._packs = {}

    def _pack(self, lora: Lora | None, into: dict | None = None) -> None:
        old = into["layers"] if into is not None and len(into["layers"]) == len(self.model.model.layers) \
            else [(None,) * 7] * len(self.model.model.layers)
        self.layers = []
        for i, layer in enumerate(self.model.model.layers):
            a, m = layer.self_attn, layer.mlp
            at, mt = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
            qk_w = None
            if self.qk_norm:  # [H + Hk, D]: each q head's scale, then each k head's
                qk_w = torch.cat([a.q_norm.weight.expand(self.n_heads, -1),
                                  a.k_norm.weight.expand(self.n_kv, -1)])
                if old[i][1] is not None and old[i][1].shape == qk_w.shape and old[i][1].dtype == qk_w.dtype:
                    qk_w = old[i][1].copy_(qk_w)  # refilled in place: the same address for a CUDA graph
            moe = experts_of(m)
            self.layers.append((
                layer.input_layernorm.weight, qk_w,
                _linear_pieces([a.q_proj, a.k_proj, a.v_proj], self.fuse,
                               [at + "q_proj", at + "k_proj", at + "v_proj"], lora, old[i][2]),
                _linear_pieces([a.o_proj], self.fuse, [at + "o_proj"], lora, old[i][3]),
                layer.post_attention_layernorm.weight,
                _linear_pieces([m.gate_proj, m.up_proj], self.fuse, [mt + "gate_proj", mt + "up_proj"], lora,
                               old[i][5]) if moe is None else expert_pieces(moe, self.fuse, old[i][5]),
                _linear_pieces([m.down_proj], self.fuse, [mt + "down_proj"], lora, old[i][6]) if moe is None else None,
            ))
        self.norm_w = self.model.model.norm.weight
        self.embed = self.model.model.embed_tokens.weight
        self.lm_head = _linear_pieces([self.model.lm_head], self.fuse, ["lm_head"], lora,
                                      into["lm_head"] if into is not None else None)
        rotary = self.model.model.rotary_emb
        self.inv_freq, self.rope_scaling = rotary.inv_freq.float(), rotary.attention_scaling

    def release(self) -> None:
        self.layers, self.cache, self.lm_head = [], [], None
        self.key_bias = self.next_pos = None
        vars(self).update(dict.fromkeys(ROPE))

    # --- pieces ----------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, w, self.eps)  # one kernel; HF's values in fp32 (`kernels`)

    def _qk(self, y: torch.Tensor, qk_w: torch.Tensor | None) -> torch.Tensor:
        """The q and k heads of the QKV output y [..., H + 2 Hk, D], before RoPE: Qwen3's
        per-head RMSNorm (HF's arithmetic in every dtype: normalise, then scale) or a view."""
        qk = y[..., :self.n_heads + self.n_kv, :]
        return qk if qk_w is None else rms_norm(qk, None, self.qk_eps) * qk_w

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
        # HF: x * cos + cat(-x2, x1) * sin  ==  x * cos + roll(x) * cat(-sin1, sin2)
        return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, -1), sin_signed)

    def rope_tables(self, length: int, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
        """The RoPE tables of `length` cache slots, by the attribute names the forward reads
        them under (`ROPE`): cos, sin' [S, D]; cs [S, 2, D] (both, one gather a decode step);
        the [D, D] identity and half roll the decode step's rotation is built from."""
        # exactly HF's arithmetic: fp32 position * inv_freq, duplicated, cos/sin, scaled, cast
        pos = torch.arange(length, device=device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.to(device)[None, :]  # [S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
        cos = (emb.cos() * self.rope_scaling).to(dtype)
        sin = (emb.sin() * self.rope_scaling).to(dtype)
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # sign of rotate_half folded in
        return {"cos": cos, "sin": sin, "cs": torch.stack((cos, sin), dim=1),
                "eye": torch.eye(self.head_dim, dtype=dtype, device=device),
                "roll": half_roll(self.head_dim, dtype, device)}

    # --- prefill ---------------------------------------------------------------------
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new: int, n: int,
              one_pass: bool = False) -> torch.Tensor:
        """Prefill left-padded prompts ids/mask [B, P] into a cache of B * n rows (each
        prompt's cache copied to its n samples). Returns last-position logits [B, V].
        one_pass: as few chunks as ONE_PASS_TOKENS allows, whatever the prompts' lengths
        (on a GPU a chunk's kernel launches cost more than its padding)."""
        B, P = ids.shape
        dtype, device = self.embed.dtype, self.embed.device
        S = P + max_new
        vars(self).update(self.rope_tables(S, dtype, device))
        self.cache = [(torch.empty(B * n, self.n_kv, S, self.head_dim, dtype=dtype, device=device),
                       torch.empty(B * n, self.n_kv, S, self.head_dim, dtype=dtype, device=device))
                      for _ in self.layers]
        lengths = mask.sum(-1).tolist()
        budget = max(ONE_PASS_TOKENS, self.prefill_chunk_tokens) if one_pass else self.prefill_chunk_tokens
        logits, r0 = [], 0
        while r0 < B:  # chunks of consecutive rows, each padded to its own longest prompt
            r1, longest = r0 + 1, lengths[r0]
            while r1 < B and (r1 + 1 - r0) * max(longest, lengths[r1]) <= budget and (
                    one_pass or max(longest, lengths[r1]) - min(lengths[r0:r1 + 1]) <= max(4, longest // 8)):
                longest = max(longest, lengths[r1])
                r1 += 1
            logits.append(self._prefill(ids[r0:r1, P - longest:], mask[r0:r1, P - longest:], r0, n, P))
            r0 = r1
        maskb = mask.bool()
        # additive attention bias over cache slots (-inf on left padding), built once: a bool
        # mask would be converted inside SDPA in every layer of every step
        self.key_bias = torch.zeros(B * n, 1, 1, S, dtype=dtype, device=device)  # [rows, 1, 1, S]
        self.key_bias[:, 0, 0, :P].masked_fill_(~maskb.repeat_interleave(n, 0), float("-inf"))
        self.next_pos = maskb.sum(-1).repeat_interleave(n, 0)  # [rows] next position id
        self.slot = P  # next cache slot (shared by all rows thanks to left padding)
        return torch.cat(logits)  # [B, V]

    def _prefill(self, ids: torch.Tensor, mask: torch.Tensor, r0: int, n: int, P: int) -> torch.Tensor:
        """Run rows r0.. of the group (ids/mask [b, L], L <= P) and write their K/V into
        cache slots P-L..P of rows r0*n.. (each prompt's n sample rows)."""
        b, L = ids.shape
        H, Hk, D, S = self.n_heads, self.n_kv, self.head_dim, self.cache[0][0].shape[2]
        device = ids.device
        maskb = mask.bool()
        pos = position_ids(maskb)  # [b, L] position ids of real tokens (left padding: 0)
        cos, sin = self.cos[pos][:, :, None], self.sin[pos][:, :, None]  # [b, L, 1, D]
        causal = torch.ones(L, L, dtype=torch.bool, device=device).tril()
        if self.window is not None and self.window < L:  # and no older than the window
            causal = causal.triu(-(self.window - 1))
        # pad queries may see themselves: defensive, as SDPA backends have differed on fully
        # masked rows (NaN there would reach V and, through 0 * NaN, every real row)
        attn_mask = (causal & maskb[:, None, None, :]) | torch.eye(L, dtype=torch.bool, device=device)
        x = functional.embedding(ids, self.embed).view(b * L, -1)  # [b*L, hidden]
        last_layer = len(self.layers) - 1
        logged = None if self.route_log is None else len(self.route_log)
        for i, ((w1, qk_w, qkv, o_proj, w2, gate_up, down), (kc, vc)) in enumerate(zip(self.layers, self.cache)):
            y = _mm(self._norm(x, w1), qkv).view(b, L, H + 2 * Hk, D)  # [b, L, heads, D]
            qk = self._rope(self._qk(y, qk_w), cos, sin).transpose(1, 2)  # [b, H+Hk, L, D]
            q, k, v = qk[:, :H], qk[:, H:], y[:, :, H + Hk:].transpose(1, 2)  # [b, *, L, D]
            # the n samples of prompt r are cache rows r*n .. r*n+n-1; slots before P-L stay
            # zero (masked; zero so garbage memory cannot turn into NaN through 0 * inf)
            for cache, new in ((kc, k), (vc, v)):
                rows = cache[r0 * n:(r0 + b) * n].view(b, n, Hk, S, D)
                rows[:, :, :, P - L:P] = new[:, None]
                rows[:, :, :, :P - L] = 0
            if self.group > 1:
                k, v = k.repeat_interleave(self.group, 1), v.repeat_interleave(self.group, 1)
            if i == last_layer:
                # past the last layer's K/V only the final position matters (it gives the
                # logits): attention, o_proj and MLP for one query per row, not L
                q, attn_mask = q[:, :, -1:], attn_mask[:, :, -1:]  # [b, H, 1, D]
                x = x.view(b, L, -1)[:, -1]  # [b, hidden] (left padding: the last slot is real)
                L = 1
            o = functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
            x = _mm(o.transpose(1, 2).reshape(b * L, H * D), o_proj, residual=x)
            x = self._mlp(self._norm(x, w2), gate_up, down, x, grouped=False)
        if logged is not None:  # each row's last position: the one its first sampled token comes from
            self.route_log[logged:] = [e.view(b, -1, e.shape[-1])[:, -1] for e in self.route_log[logged:]]
        return _mm(self._norm(x, self.norm_w), self.lm_head)  # [b, V]

    def _mlp(self, h: torch.Tensor, gate_up, down, residual: torch.Tensor, grouped: bool) -> torch.Tensor:
        """residual + the layer's MLP of h [N, hidden]: SiLU-gated, or a mixture of experts
        (`moe_forward`; `grouped` in decode: a fixed number of kernels, no host read)."""
        if isinstance(gate_up, Experts):
            out, index = moe_forward(h, gate_up, grouped)
            if self.route_log is not None:
                self.route_log.append(index)
            return residual + out
        g, u = _mm(h, gate_up).chunk(2, dim=-1)
        return _mm(functional.silu(g).mul_(u), down, residual=residual)

    # --- decode ----------------------------------------------------------------------
    def select(self, rows: torch.Tensor) -> None:
        """Keep only these cache rows (compaction after sequences finish)."""
        self.cache = [(kc[rows], vc[rows]) for kc, vc in self.cache]
        self.key_bias, self.next_pos = self.key_bias[rows], self.next_pos[rows]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (tokens [b]); returns next-token logits [b, V]."""
        logits = self.decode_step(tokens, self.slot)
        self.slot += 1
        self.next_pos = self.next_pos + 1
        return logits

    def decode_step(self, tokens: torch.Tensor, slot: int | torch.Tensor,
                    slots: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step of tokens [b] at positions `self.next_pos`, their K/V written to
        cache slot `slot`; returns logits [b, V]. Changes only the cache: the caller
        advances the slot and positions.

        slot an int (the host's count, `decode`): attention over slots 0..slot.
        slot a [1] long device tensor (`baton.rollout.embedded.static_decode`): over all S slots, those
        past `slot` masked (slots = arange(S)) - every shape and address fixed and no host
        value read, so the step can be captured as a CUDA graph. The two differ only in
        SDPA's summation order (fp32: a few 1e-6 in a logprob)."""
        b = tokens.shape[0]
        H, Hk, G, D = self.n_heads, self.n_kv, self.group, self.head_dim
        fixed = isinstance(slot, torch.Tensor)
        S, window = self.key_bias.shape[-1], self.window
        windowed = window is not None and window < S
        if fixed:  # unfilled slots hold zeros (masked; no 0 * NaN)
            hidden = slots > slot
            if windowed:  # and slots the window has left
                hidden = hidden | (slots <= slot - window)
            attn_mask = self.key_bias.masked_fill(hidden, float("-inf"))  # [b, 1, 1, S]
            lo = 0
        else:
            lo = max(0, slot + 1 - window) if windowed else 0
            attn_mask = self.key_bias[..., lo:slot + 1]  # [b, 1, 1, s+1-lo]
        rope = rope_matrices(self.cs[self.next_pos], self.eye, self.roll)  # [b, D, D] for every layer
        x = functional.embedding(tokens, self.embed)  # [b, hidden]
        for (w1, qk_w, qkv, o_proj, w2, gate_up, down), (kc, vc) in zip(self.layers, self.cache):
            y = _mm(self._norm(x, w1), qkv).view(b, H + 2 * Hk, D)  # [b, heads, D]
            qk = torch.bmm(self._qk(y, qk_w), rope)  # [b, H + Hk, D] one RoPE for q and k
            if fixed:
                kc.index_copy_(2, slot, qk[:, H:, None])
                vc.index_copy_(2, slot, y[:, H + Hk:, None])
            else:
                kc[:, :, slot], vc[:, :, slot] = qk[:, H:], y[:, H + Hk:]
                kc, vc = kc[:, :, lo:slot + 1], vc[:, :, lo:slot + 1]
            q = qk[:, :H].view(b, Hk, G, D)  # the G query heads of a KV head act as a "length"
            o = functional.scaled_dot_product_attention(q, kc, vc, attn_mask=attn_mask, scale=self.scale)
            x = _mm(o.reshape(b, H * D), o_proj, residual=x)  # o [b, Hk, G, D]
            x = self._mlp(self._norm(x, w2), gate_up, down, x, grouped=True)
        return _mm(self._norm(x, self.norm_w), self.lm_head)  # [b, V]
