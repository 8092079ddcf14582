"""Fast forward pass for Llama / Qwen2-family HF models, with a preallocated KV cache.

HF's own forward spends most of a small model's decode step in Python: cache objects,
mask construction, rotary modules, output dataclasses. This runner reads the *same* weight
tensors (no copy of the parameters; so an optimizer step on a colocated trainer module is
seen by the next `generate`) and runs a lean forward:

  * one static KV cache per layer, [rows, kv_heads, prompt_len + max_new, head_dim],
    with left-padded prompts, so every row writes its next token to the same slot;
  * RMSNorm, RoPE (the model's own inv_freq / attention scaling, computed exactly as HF
    does), GQA, SiLU-gated MLP, optional q/k/v (Qwen2) and o/MLP (Llama) biases;
  * decode attention treats the query heads of one KV group as the "query length"
    ([rows, kv_heads, group, head_dim]), so GQA needs no expanded K/V.

Q/K/V and gate/up are fused into one matmul each. The fused weights are *built* from the
parameters by `pack()`, which the engine calls at the start of every `generate`, so they
can never be stale; set `fuse=False` to skip the copy (e.g. a large model on a tight GPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

_STATIC_ROPE = {"default", "linear", "llama3", "yarn"}  # inv_freq does not depend on length


def supports(model: nn.Module) -> bool:
    """True when `model` is a plain (unwrapped, unquantized) Llama / Qwen2 causal LM."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ("llama", "qwen2"):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return False
    if any(t != "full_attention" for t in (getattr(cfg, "layer_types", None) or [])):
        return False  # sliding-window layers: leave to HF
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in _STATIC_ROPE:
        return False
    layer0 = inner.layers[0]
    linears = [layer0.self_attn.q_proj, layer0.self_attn.k_proj, layer0.self_attn.v_proj,
               layer0.self_attn.o_proj, layer0.mlp.gate_proj, layer0.mlp.up_proj,
               layer0.mlp.down_proj, model.lm_head]
    return all(type(m) is nn.Linear for m in linears)  # LoRA / quantized wrappers: HF path


def _cat(tensors: list[torch.Tensor | None]) -> torch.Tensor | None:
    if all(t is None for t in tensors):
        return None
    # a missing bias among present ones would be a malformed model; fill with zeros
    ref = next(t for t in tensors if t is not None)
    return torch.cat([t if t is not None else ref.new_zeros(ref.shape) for t in tensors])


class LlamaRunner:
    """Prefill / decode over a static KV cache for one `generate` call at a time."""

    def __init__(self, model: nn.Module, fuse: bool = True):
        self.model = model
        self.fuse = fuse
        cfg = model.config
        attn = model.model.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads
        self.group = self.n_heads // self.n_kv
        self.scale = attn.scaling
        self.eps = model.model.norm.variance_epsilon
        self.layers: list[tuple] = []
        self.cache: list[tuple[torch.Tensor, torch.Tensor]] = []

    # --- weights ---------------------------------------------------------------------
    def pack(self) -> None:
        """Collect (and fuse) the weights the forward uses, from the live parameters."""
        self.layers = []
        for layer in self.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            if self.fuse:
                qkv = (torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                       _cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]))
                gate_up = (torch.cat([m.gate_proj.weight, m.up_proj.weight]),
                           _cat([m.gate_proj.bias, m.up_proj.bias]))
            else:
                qkv = gate_up = None
            self.layers.append((layer.input_layernorm.weight, a, qkv, a.o_proj,
                                layer.post_attention_layernorm.weight, m, gate_up))
        rotary = self.model.model.rotary_emb
        self.inv_freq = rotary.inv_freq.float()
        self.rope_scaling = rotary.attention_scaling
        self.norm_w = self.model.model.norm.weight
        self.embed = self.model.model.embed_tokens.weight
        self.lm_head = self.model.lm_head

    def release(self) -> None:
        self.layers, self.cache = [], []
        self.cos = self.sin = self.key_mask = self.next_pos = None

    # --- pieces ----------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        # HF: normalise in fp32, cast back, then scale by the weight
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    def _qkv(self, h: torch.Tensor, a: nn.Module, qkv) -> torch.Tensor:
        if qkv is not None:
            return F.linear(h, qkv[0], qkv[1])
        return torch.cat([a.q_proj(h), a.k_proj(h), a.v_proj(h)], dim=-1)

    def _mlp(self, h: torch.Tensor, m: nn.Module, gate_up) -> torch.Tensor:
        if gate_up is not None:
            g, u = F.linear(h, gate_up[0], gate_up[1]).chunk(2, dim=-1)
        else:
            g, u = m.gate_proj(h), m.up_proj(h)
        return m.down_proj(F.silu(g) * u)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half
        return x * cos + rot * sin

    def _rope_tables(self, length: int, dtype: torch.dtype, device: torch.device) -> None:
        # exactly HF's arithmetic: fp32 position * inv_freq, duplicated, cos/sin, scaled, cast
        pos = torch.arange(length, device=device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq.to(device)[None, :]  # [S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
        self.cos = (emb.cos() * self.rope_scaling).to(dtype)
        self.sin = (emb.sin() * self.rope_scaling).to(dtype)

    # --- prefill ---------------------------------------------------------------------
    def start(self, ids: torch.Tensor, mask: torch.Tensor, max_new: int, n: int) -> torch.Tensor:
        """Prefill left-padded prompts ids/mask [B, P] into a cache of B * n rows (each
        prompt's cache copied to its n samples). Returns last-position logits [B, V]."""
        B, P = ids.shape
        dtype, device = self.embed.dtype, self.embed.device
        S = P + max_new
        self._rope_tables(S, dtype, device)
        self.cache = [(torch.empty(B * n, self.n_kv, S, self.head_dim, dtype=dtype, device=device),
                       torch.empty(B * n, self.n_kv, S, self.head_dim, dtype=dtype, device=device))
                      for _ in self.layers]
        maskb = mask.bool()
        pos = (maskb.long().cumsum(-1) - 1).clamp(min=0)  # [B, P] position ids of real tokens
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]  # [B, 1, P, D]
        causal = torch.ones(P, P, dtype=torch.bool, device=device).tril()
        # pad queries may see themselves: a fully masked row would give NaN and poison V
        attn_mask = (causal & maskb[:, None, None, :]) | torch.eye(P, dtype=torch.bool, device=device)
        H, Hk, D = self.n_heads, self.n_kv, self.head_dim
        x = F.embedding(ids, self.embed)  # [B, P, hidden]
        for (w1, a, qkv, o_proj, w2, m, gate_up), (kc, vc) in zip(self.layers, self.cache):
            h = self._norm(x, w1)
            y = self._qkv(h, a, qkv).view(B, P, H + 2 * Hk, D).transpose(1, 2)  # [B, heads, P, D]
            q = self._rope(y[:, :H], cos, sin)  # [B, H, P, D]
            k = self._rope(y[:, H:H + Hk], cos, sin)  # [B, Hk, P, D]
            v = y[:, H + Hk:]  # [B, Hk, P, D]
            # the n samples of prompt b are rows b*n .. b*n+n-1
            kc.view(B, n, Hk, S, D)[:, :, :, :P] = k[:, None]
            vc.view(B, n, Hk, S, D)[:, :, :, :P] = v[:, None]
            if self.group > 1:
                k, v = k.repeat_interleave(self.group, 1), v.repeat_interleave(self.group, 1)
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
            x = x + o_proj(o.transpose(1, 2).reshape(B, P, H * D))
            x = x + self._mlp(self._norm(x, w2), m, gate_up)
        logits = self.lm_head(self._norm(x[:, -1], self.norm_w))  # [B, V]
        # per-row state for decoding, expanded to the B * n sample rows
        self.key_mask = torch.ones(B * n, S, dtype=torch.bool, device=device)  # [rows, S]
        self.key_mask[:, :P] = maskb.repeat_interleave(n, 0)
        self.next_pos = maskb.sum(-1).repeat_interleave(n, 0)  # [rows] next position id
        self.slot = P  # next cache slot (shared by all rows thanks to left padding)
        return logits

    # --- decode ----------------------------------------------------------------------
    def select(self, rows: torch.Tensor) -> None:
        """Keep only these cache rows (compaction after sequences finish)."""
        self.cache = [(kc[rows], vc[rows]) for kc, vc in self.cache]
        self.key_mask, self.next_pos = self.key_mask[rows], self.next_pos[rows]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (tokens [b]); returns next-token logits [b, V]."""
        b = tokens.shape[0]
        H, Hk, G, D = self.n_heads, self.n_kv, self.group, self.head_dim
        s = self.slot
        cos, sin = self.cos[self.next_pos][:, None], self.sin[self.next_pos][:, None]  # [b, 1, D]
        attn_mask = self.key_mask[:, None, None, :s + 1]  # [b, 1, 1, s+1]
        x = F.embedding(tokens, self.embed)  # [b, hidden]
        for (w1, a, qkv, o_proj, w2, m, gate_up), (kc, vc) in zip(self.layers, self.cache):
            h = self._norm(x, w1)
            y = self._qkv(h, a, qkv).view(b, H + 2 * Hk, D)  # [b, heads, D]
            qk = self._rope(y[:, :H + Hk], cos, sin)  # [b, H + Hk, D] one RoPE for q and k
            kc[:, :, s] = qk[:, H:]
            vc[:, :, s] = y[:, H + Hk:]
            q = qk[:, :H].view(b, Hk, G, D)  # the G query heads of a KV head act as a "length"
            o = F.scaled_dot_product_attention(q, kc[:, :, :s + 1], vc[:, :, :s + 1],
                                               attn_mask=attn_mask, scale=self.scale)  # [b, Hk, G, D]
            x = x + o_proj(o.reshape(b, H * D))
            x = x + self._mlp(self._norm(x, w2), m, gate_up)
        self.slot += 1
        self.next_pos = self.next_pos + 1
        return self.lm_head(self._norm(x, self.norm_w))  # [b, V]
