"""One transformer decoder layer as vLLM computes it, in PyTorch, for prefill and for a decode step.

Fused QKV and gate/up projections, RMSNorm (plus per-head q/k norms for Qwen3), rotary embedding,
the KV-cache write, grouped-query attention, gated MLP; random bf16 weights of a `ModelSpec`. Used by
`kvoffload/calibrate/gpu.py` for timing; it computes, it never times. torch is passed in by the caller
(imported inside functions elsewhere), so this module imports on hosts without torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvoffload.calibrate.shapes import ModelSpec

if TYPE_CHECKING:
    from torch import Tensor
    from torch import device as Device

Attention = Callable[["Tensor", "Tensor", "Tensor"], "Tensor"]


@dataclass
class LayerWeights:
    """One decoder layer's parameters, in the (out, in) layout F.linear takes."""

    wqkv: Tensor
    wo: Tensor
    wgu: Tensor
    wdown: Tensor
    ln1: Tensor
    ln2: Tensor
    qn: Tensor | None
    kn: Tensor | None


def random_weight(torch: Any, shape: tuple[int, ...], device: Device, scale: float) -> Tensor:
    """Normal random values (never zeros: they run faster than real data) scaled to keep activations sane."""
    t: Tensor = torch.randn(shape, device=device, dtype=torch.bfloat16).mul_(scale)
    return t


def make_layer(torch: Any, spec: ModelSpec, device: Device) -> LayerWeights:
    h, i = spec.hidden, spec.intermediate

    def ones(n: int) -> Tensor:
        t: Tensor = random_weight(torch, (n,), device, 0.05).add_(1.0)
        return t

    return LayerWeights(
        wqkv=random_weight(torch, (spec.q_width + 2 * spec.kv_width, h), device, h**-0.5),
        wo=random_weight(torch, (h, spec.q_width), device, spec.q_width**-0.5),
        wgu=random_weight(torch, (2 * i, h), device, h**-0.5),
        wdown=random_weight(torch, (h, i), device, i**-0.5),
        ln1=ones(h),
        ln2=ones(h),
        qn=ones(spec.head_dim) if spec.qk_norm else None,
        kn=ones(spec.head_dim) if spec.qk_norm else None,
    )


def rope_tables(torch: Any, positions: Tensor, head_dim: int) -> tuple[Tensor, Tensor]:
    """cos and sin tables (len(positions), head_dim) in bf16, rotate-half convention, theta 500000."""
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)
    cos: Tensor = ang.cos().to(torch.bfloat16)
    sin: Tensor = ang.sin().to(torch.bfloat16)
    return cos, sin


def _rotate(torch: Any, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    out: Tensor = x * cos + rotated * sin
    return out


def _mlp(torch: Any, spec: ModelSpec, w: LayerWeights, x: Tensor) -> Tensor:
    f = torch.nn.functional
    h = f.rms_norm(x, (spec.hidden,), w.ln2, 1e-5)
    gate, up = f.linear(h, w.wgu).chunk(2, dim=-1)
    out: Tensor = x + f.linear(f.silu(gate) * up, w.wdown)
    return out


def prefill_layer(
    torch: Any,
    spec: ModelSpec,
    w: LayerWeights,
    x: Tensor,
    rope: tuple[Tensor, Tensor],
    cache: tuple[Tensor, Tensor],
    attend: Attention,
) -> Tensor:
    """One layer over a whole prompt x (T, hidden); writes the prompt's K and V into cache (Hkv, T, D)."""
    f = torch.nn.functional
    t = x.shape[0]
    h = f.rms_norm(x, (spec.hidden,), w.ln1, 1e-5)
    q, k, v = f.linear(h, w.wqkv).split([spec.q_width, spec.kv_width, spec.kv_width], dim=-1)
    q = q.view(t, spec.num_heads, spec.head_dim).transpose(0, 1)
    k = k.view(t, spec.num_kv_heads, spec.head_dim).transpose(0, 1)
    v = v.view(t, spec.num_kv_heads, spec.head_dim).transpose(0, 1)
    if w.qn is not None and w.kn is not None:
        q = f.rms_norm(q, (spec.head_dim,), w.qn, 1e-6)
        k = f.rms_norm(k, (spec.head_dim,), w.kn, 1e-6)
    q = _rotate(torch, q, *rope)
    k = _rotate(torch, k, *rope)
    cache[0].copy_(k)
    cache[1].copy_(v)
    o = attend(q.unsqueeze(0), cache[0].unsqueeze(0), cache[1].unsqueeze(0))
    o = o.squeeze(0).transpose(0, 1).reshape(t, spec.q_width)
    return _mlp(torch, spec, w, x + f.linear(o, w.wo))


def decode_layer(
    torch: Any,
    spec: ModelSpec,
    w: LayerWeights,
    x: Tensor,
    rope: tuple[Tensor, Tensor],
    cache: tuple[Tensor, Tensor],
    attend: Attention,
) -> Tensor:
    """One layer's decode step for x (B, hidden) over caches (B, Hkv, C, D); the new token's K and V
    go into the last slot. Query heads are grouped per KV head as (B, Hkv, group, D), exact for one
    query token and what decode kernels do for grouped-query attention."""
    f = torch.nn.functional
    b = x.shape[0]
    group = spec.num_heads // spec.num_kv_heads
    h = f.rms_norm(x, (spec.hidden,), w.ln1, 1e-5)
    q, k, v = f.linear(h, w.wqkv).split([spec.q_width, spec.kv_width, spec.kv_width], dim=-1)
    q = q.reshape(b, spec.num_kv_heads, group, spec.head_dim)
    k = k.reshape(b, spec.num_kv_heads, 1, spec.head_dim)
    v = v.reshape(b, spec.num_kv_heads, 1, spec.head_dim)
    if w.qn is not None and w.kn is not None:
        q = f.rms_norm(q, (spec.head_dim,), w.qn, 1e-6)
        k = f.rms_norm(k, (spec.head_dim,), w.kn, 1e-6)
    q = _rotate(torch, q, *rope)
    k = _rotate(torch, k, *rope)
    cache[0][:, :, -1:].copy_(k)
    cache[1][:, :, -1:].copy_(v)
    o = attend(q, cache[0], cache[1]).reshape(b, spec.q_width)
    return _mlp(torch, spec, w, x + f.linear(o, w.wo))


def causal_sdpa(torch: Any) -> Attention:
    def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out: Tensor = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
        return out

    return attend


def decode_attention(torch: Any, impl: str) -> Attention:
    """Attention of grouped queries (B, Hkv, G, D) over a whole cache (B, Hkv, C, D).

    'sdpa': scaled_dot_product_attention, the dispatcher's kernel. 'matmul': two batched matrix
    products and a float32 softmax, which cuBLAS spreads over the context the way split-KV decode
    kernels (FlashAttention's, FlashInfer's) do; PyTorch's fused kernels do not split a long context.
    """
    if impl == "sdpa":

        def sdpa(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            out: Tensor = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return out

        return sdpa

    def matmul(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(q.shape[-1] ** -0.5)
        out: Tensor = torch.matmul(scores.softmax(dim=-1).to(v.dtype), v)
        return out

    return matmul


def reference_attention(torch: Any, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal grouped-query attention in float64, KV heads repeated explicitly (no fused kernel)."""
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    scores = torch.matmul(q.double(), kk.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    out: Tensor = torch.matmul(scores.masked_fill(~mask, float("-inf")).softmax(dim=-1), vv)
    return out


def rel_err(torch: Any, out: Tensor, ref: Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())
