"""One transformer block as two forward/backward pairs, composed only from euler-kernels ops.

    x = x + attn(rmsnorm(x))        attention_block_forward / attention_block_backward
    x = x + swiglu(rmsnorm(x))      ffn_block_forward / ffn_block_backward

Each forward returns (out, cache) where cache holds only the kernel caches its backward needs;
each backward runs the ops in exactly the reverse order and returns (dx, grads of the block's weights).
The residual stream is kept flat, x (N, C) with N = B * T, so that every linear is one 2-D matrix
product; only RoPE and attention see the (B, T, H, D) view.

bf16 (the GPU bf16 path, see euler_kernels.cuda.bf16_activations): every activation between the norm and
the block's output projection is stored as bf16 (h, q, k, v, the attention output, gate, up, their
SwiGLU product) and so are the gradients that only feed bf16 products; the residual stream x, its
gradient, the norms' statistics and every weight gradient stay float32.
"""

from __future__ import annotations

from typing import Any

import euler_kernels as ek
from euler_model.config import ModelConfig


def attention_block_forward(
    config: ModelConfig,
    p: dict[str, Any],
    prefix: str,
    x: Any,
    bt: tuple[int, int],
    rope: tuple[Any, Any],
    kv: Any = None,
    bf16: bool = False,
) -> tuple[Any, tuple]:
    """x (N, C), N = B * T, bt = (B, T) -> x + wo(attention(rope(wq h), rope(wk h), wv h)), h = rmsnorm(x).

    kv: None for training, else a (KVCache, layer) pair: the new keys/values are written at the
    cache's current position and the queries attend over everything cached so far (no backward).
    """
    b, t = bt
    hq, hkv, d = config.n_heads, config.n_kv_heads, config.head_dim
    offset = 0 if kv is None else kv[0].length
    h, c_norm = ek.rmsnorm_forward(x, p[prefix + "attn_norm"], config.norm_eps, bf16_out=bf16)  # (N, C)
    qkv = ek.linear_forward_many(h, [p[prefix + "wq"], p[prefix + "wk"], p[prefix + "wv"]], bf16_out=bf16)
    (q, c_q), (k, c_k), (v, c_v) = qkv  # (N, Hq * D), (N, Hkv * D), (N, Hkv * D)
    q, c_rq = ek.rope_forward(q.reshape(b, t, hq, d), rope[0], rope[1], offset)  # (B, T, Hq, D)
    k, c_rk = ek.rope_forward(k.reshape(b, t, hkv, d), rope[0], rope[1], offset)  # (B, T, Hkv, D)
    v = v.reshape(b, t, hkv, d)
    if kv is not None:  # append to the cache, attend over the whole cached prefix
        k, v = kv[0].append(kv[1], k, v)  # (B, S, Hkv, D) with S = offset + T
    a, c_att = ek.attention_forward(q, k, v, causal=True)  # (B, T, Hq, D)
    o, c_o = ek.linear_forward(a.reshape(b * t, hq * d), p[prefix + "wo"])  # (N, C)
    out, c_res = ek.residual_forward(x, o)  # (N, C)
    return out, (c_norm, c_q, c_k, c_v, c_rq, c_rk, c_att, c_o, c_res, (b, t, hq, hkv, d, bf16))


def attention_block_backward(dout: Any, cache: tuple, prefix: str) -> tuple[Any, dict[str, Any]]:
    """Gradients of attention_block_forward: (dx (N, C), {name: dweight})."""
    c_norm, c_q, c_k, c_v, c_rq, c_rk, c_att, c_o, c_res, (b, t, hq, hkv, d, bf16) = cache
    dx, do = ek.residual_backward(dout, c_res)  # (N, C) each
    da, dwo = ek.linear_backward(do, c_o, bf16_dx=bf16)  # (N, Hq * D)
    dq, dk, dv = ek.attention_backward(da.reshape(b, t, hq, d), c_att)
    dq = ek.rope_backward(dq, c_rq).reshape(b * t, hq * d)
    dk = ek.rope_backward(dk, c_rk).reshape(b * t, hkv * d)
    dh, dwv = ek.linear_backward(dv.reshape(b * t, hkv * d), c_v)
    dh, dwk = ek.linear_backward(dk, c_k, dx_into=dh)  # h feeds three projections: their dh add up
    dh, dwq = ek.linear_backward(dq, c_q, dx_into=dh)
    dx_norm, dnorm = ek.rmsnorm_backward(dh, c_norm)
    grads = {"attn_norm": dnorm, "wq": dwq, "wk": dwk, "wv": dwv, "wo": dwo}
    return dx + dx_norm, {prefix + k: g for k, g in grads.items()}


def ffn_block_forward(
    config: ModelConfig, p: dict[str, Any], prefix: str, x: Any, bf16: bool = False
) -> tuple[Any, tuple]:
    """x (N, C) -> x + w_down(silu(w_gate h) * w_up h) with h = rmsnorm(x)."""
    h, c_norm = ek.rmsnorm_forward(x, p[prefix + "ffn_norm"], config.norm_eps, bf16_out=bf16)  # (N, C)
    gate_up = ek.linear_forward_many(h, [p[prefix + "w_gate"], p[prefix + "w_up"]], bf16_out=bf16)
    (g, c_gate), (u, c_up) = gate_up  # (N, F) each
    s, c_swi = ek.swiglu_forward(g, u)  # (N, F)
    o, c_down = ek.linear_forward(s, p[prefix + "w_down"])  # (N, C)
    out, c_res = ek.residual_forward(x, o)  # (N, C)
    return out, (c_norm, c_gate, c_up, c_swi, c_down, c_res, bf16)


def ffn_block_backward(dout: Any, cache: tuple, prefix: str) -> tuple[Any, dict[str, Any]]:
    """Gradients of ffn_block_forward: (dx (N, C), {name: dweight})."""
    c_norm, c_gate, c_up, c_swi, c_down, c_res, bf16 = cache
    dx, do = ek.residual_backward(dout, c_res)
    ds, dw_down = ek.linear_backward(do, c_down, bf16_dx=bf16)  # (N, F)
    dg, du = ek.swiglu_backward(ds, c_swi)
    dh, dw_up = ek.linear_backward(du, c_up)
    dh, dw_gate = ek.linear_backward(dg, c_gate, dx_into=dh)
    dx_norm, dnorm = ek.rmsnorm_backward(dh, c_norm)
    grads = {"ffn_norm": dnorm, "w_gate": dw_gate, "w_up": dw_up, "w_down": dw_down}
    return dx + dx_norm, {prefix + k: g for k, g in grads.items()}
