"""One transformer block, each of its two halves in three modes (training forward, its backward, and the
decode step against a static KV cache), composed only from euler-kernels ops.

    x = x + attn(rmsnorm(x))        attention_block_forward / _backward / _decode
    x = x + swiglu(rmsnorm(x))      ffn_block_forward / _backward / _decode
    (layer i: both, in that order)   layer_forward / layer_backward / layer_decode

The decode step (decode_step.py runs it) computes what the forward computes, with the inference form of
the weights (q/k/v and gate/up joined, bf16 copies in the bf16 modes) and fused decode ops: the norm rides
in the product after it, the residual addition in the product before it (ek.decode_linear_forward), RoPE
and the cache write in attention (ek.decode_attention_forward).

The residual stream travels between blocks as a pair (x, branch) standing for x + branch: each block
returns its output branch un-added, and the next norm adds it (ek.residual_rmsnorm_forward: one pass
over the stream instead of an addition pass and a norm pass). branch is None before the first block.
Each forward returns ((s, o), cache), s = x + branch its input and o its branch, with a cache of only
the kernel caches its backward needs (AttentionBlockCache, FFNBlockCache, LayerCache: named fields);
each backward takes the gradient of the stream after the block (of s + o), runs the ops in exactly the
reverse order and returns (the gradient of the stream before it, which is that of x and of branch
alike; the block's weight gradients). The stream is kept flat, (N, C) with N = B * T, so that every
linear is one 2-D matrix product; only RoPE and attention see the (B, T, H, D) view.

bf16 (the GPU bf16 path, of a bf16 or fp8 precision: model.bf16_path): every activation between the norm
and the block's output projection is stored as bf16 (h, q, k, v, the attention output, gate, up, their
SwiGLU product) and so are the gradients that only feed bf16 products; the residual stream x, its
gradient, the norms' statistics and every weight gradient stay float32 (with bf16_grads, train.bf16_grads,
the products' weight gradients are bf16, as autocast's are before their cast). The caches of the bf16 path
do not keep the two cheapest activations to make again, each norm's output h and the SwiGLU product: the
backward re-makes them (one norm or SwiGLU pass each, the same bits, as torch.compile's default
recomputes them) right before the products that need them, so a step holds 2C + F fewer bf16 values per
token and layer (2.3 GiB at the 856M preset, 8 x 1024 tokens). With keep=True (train.keep_activations)
the caches keep them instead: the backward skips the re-making passes, for that much more memory.

fp8 (the fp8 precision): the bf16 path, with the MLP's weights handed in as FP8 copies
(model.py); the same code runs, the linear op multiplying those in FP8 (euler_kernels' linear_fp8). Its
FFN block re-makes nothing: the products keep the transposed FP8 copies of h and of the SwiGLU product
that their weight gradients take (C + F bytes per token and layer, half of what bf16 copies would hold).
With delayed FP8 scales in the layer's params (FP8_SCALES, model.trunk_forward's fp8_scales), the SwiGLU
kernels write their product and its gradients straight to FP8 (ek.swiglu_forward_fp8 / _backward_fp8)
instead of bf16 arrays that a cast pass reads again; until the scales hold a step's maxima (the first
step) the block runs as without them, raising the scales' maxima for the next steps.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import euler_kernels as ek
from euler_model.config import ModelConfig

FP8_SCALES = "fp8.scales"  # in a layer's params: (ek.Fp8Scales, the layer's first slot)
BRANCH_SCALE = 1.0  # test-only: every block's branch scaled, x = x + s f(rmsnorm(x)) (see scaled_branches)
FP8_SLOT_FORMATS = ("e4m3", "e5m2", "e5m2")  # a layer's slots: the SwiGLU product, dgate, dup


class NormRemake(NamedTuple):
    """What re-makes a norm's bf16 output h in the backward (norm_again): h = rmsnorm(s, weight, eps)."""

    s: Any  # (N, C) the norm's input, x + branch
    weight: Any  # (C,)
    eps: float


class AttentionBlockCache(NamedTuple):
    """attention_block_forward's cache: its ops' caches, and the sizes and modes its backward needs."""

    norm: Any  # ek.rmsnorm_forward's or ek.residual_rmsnorm_forward's (norm_in)
    qkv: Any  # ek.qkv_forward's (the joint product, bf16 path), or None
    q: Any  # the separate q, k and v products' ek.linear_forward caches, or None with the joint product
    k: Any
    v: Any
    rope_q: Any  # the separate path's ek.rope_forward caches of q and k, or None with the joint product
    rope_k: Any
    attention: Any  # ek.attention_forward's
    out: Any  # the output projection wo's ek.linear_forward cache
    batch: int  # B
    seq: int  # T
    n_heads: int  # Hq
    n_kv_heads: int  # Hkv
    head_dim: int  # D
    bf16: bool  # bf16 activations (the bf16 path)
    fp8: bool  # the layer's FFN multiplies in FP8: the stream gradient handed to it carries its maximum
    remake: NormRemake | None  # what re-makes h for the backward, or None where the caches keep h


class FFNBlockCache(NamedTuple):
    """ffn_block_forward's cache: its ops' caches, and the modes its backward needs."""

    norm: Any  # ek.rmsnorm_forward's or ek.residual_rmsnorm_forward's (norm_in)
    gate: Any  # w_gate's ek.linear_forward cache
    up: Any  # w_up's
    swiglu: Any  # ek.swiglu_forward's (or ek.swiglu_forward_fp8's)
    down: Any  # w_down's
    bf16: bool  # bf16 activations (the bf16 path)
    fp8: bool  # the MLP's products are FP8 ones
    scaled: Any  # (ek.Fp8Scales, the layer's first slot) of delayed FP8 scales, or None
    delayed: bool  # the scales hold a step's maxima: SwiGLU writes its outputs straight to FP8
    remake: NormRemake | None  # what re-makes h (and SwiGLU's backward the product), or None: both kept


class LayerCache(NamedTuple):
    """layer_forward's cache: its two blocks'."""

    attention: AttentionBlockCache
    ffn: FFNBlockCache


def fp8_scale_formats(config: ModelConfig) -> list[str]:
    """The formats of the delayed FP8 scales of a model (ek.new_fp8_scales): three slots a layer.

    >>> from euler_model import preset
    >>> fp8_scale_formats(preset("tiny"))[:4]
    ['e4m3', 'e5m2', 'e5m2', 'e4m3']
    """
    return list(FP8_SLOT_FORMATS) * config.n_layers


def norm_in(
    config: ModelConfig, weight: Any, stream: tuple[Any, Any], bf16: bool, amax: Any = None
) -> tuple[Any, Any, tuple]:
    """(s, h, cache): s = x + branch (x when branch is None) and h = rmsnorm(s), from stream = (x, branch);
    the cache serves ek.residual_rmsnorm_backward either way. amax (bf16 h): raised to h's maximum."""
    x, branch = stream
    if branch is None:
        h, cache = ek.rmsnorm_forward(x, weight, config.norm_eps, bf16_out=bf16, amax=amax)
        return x, h, cache
    (s, h), cache = ek.residual_rmsnorm_forward(x, branch, weight, config.norm_eps, bf16_out=bf16, amax=amax)
    return s, h, cache


def norm_backward(
    ds: Any, dh: Any, cache: tuple, bf16: bool, amax: bool = False
) -> tuple[tuple[Any, Any, Any], Any]:
    """Gradients of norm_in: ds, the gradient reaching s from the stream (or None), and dh that of h (in
    bf16 mode bf16 where bf16 products summed it) ->
    ((dx, dx16, amax16), dweight), dx that of x and of branch; in bf16 mode dx16 is dx rounded to bf16 in
    the same pass (the next block back feeds it to its output projection's products), else None; with
    amax (bf16 mode), amax16 is dx16's maximum measured in that pass (for FP8 products), else None."""
    if bf16:
        a16 = ek.fp8_amax() if amax else None
        dx, dweight, dx16 = ek.residual_rmsnorm_backward_bf16_copy(ds, dh, cache, amax=a16)
        return (dx, dx16, a16), dweight
    dx, dweight = ek.residual_rmsnorm_backward(ds, dh, cache)
    return (dx, None, None), dweight


def norm_again(remake: NormRemake | None) -> Any:
    """A norm's bf16 output h made again from remake, or None for None: rmsnorm_forward on s is the very
    arithmetic norm_in ran on x + branch (the same kernel body), so h has the same bits."""
    if remake is None:
        return None
    return ek.rmsnorm_forward(remake.s, remake.weight, remake.eps, bf16_out=True)[0]


def attention_block_forward(
    config: ModelConfig,
    p: dict[str, Any],
    prefix: str,
    stream: tuple[Any, Any],
    bt: tuple[int, int],
    rope: tuple[Any, Any],
    kv: Any = None,
    bf16: bool = False,
    keep: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[tuple[Any, Any], AttentionBlockCache]:
    """stream (x, branch) of (N, C), N = B * T, bt = (B, T) -> (s, o): s = x + branch, h = rmsnorm(s),
    o = wo(attention(rope(wq h), rope(wk h), wv h)); the stream after the block is s + o.

    kv: None for training, else a prefill's (decode_state.PrefillRows, layer) pair: the keys and values
    (after RoPE) are also written into the decode state's rows (no backward).
    keep: the bf16 cache keeps h instead of re-making it in the backward (module docstring).
    precision: how the products and attention are computed (euler_kernels.Precision); bf16: whether the
    activations are bf16 (the GPU's bf16 path in training, see trunk_forward).
    """
    b, t = bt
    hq, hkv, d = config.n_heads, config.n_kv_heads, config.head_dim
    offset = 0  # a forward always starts at position 0 (a prefill included)
    s, h, c_norm = norm_in(config, p[prefix + "attn_norm"], stream, bf16)  # (N, C) each
    projections = [p[prefix + "wq"], p[prefix + "wk"], p[prefix + "wv"]]
    joint = ek.stacked_rows(projections) if bf16 and kv is None else None  # bf16 copies made together
    if joint is not None:  # one product; q, k, v heads of its rows, q and k rotated where they lie
        (q, k, v), c_qkv = ek.qkv_forward(h, joint, hq, hkv, bt, *rope, offset, True, keep, precision)
        c_q = c_k = c_v = c_rq = c_rk = None
    else:
        c_qkv = None
        kept = keep or not bf16  # else re-made
        qkv = ek.linear_forward_many(h, projections, bf16_out=bf16, keep_input=kept, precision=precision)
        (q, c_q), (k, c_k), (v, c_v) = qkv  # (N, Hq * D), (N, Hkv * D), (N, Hkv * D)
        q, c_rq = ek.rope_forward(q.reshape(b, t, hq, d), rope[0], rope[1], offset)  # (B, T, Hq, D)
        k, c_rk = ek.rope_forward(k.reshape(b, t, hkv, d), rope[0], rope[1], offset)  # (B, T, Hkv, D)
        v = v.reshape(b, t, hkv, d)
    if kv is not None:  # a prefill: the decode steps that follow attend to these keys and values
        kv[0].write(kv[1], k, v)  # (B, T, Hkv, D) each
    a, c_att = ek.attention_forward(q, k, v, causal=True, precision=precision)  # (B, T, Hq, D)
    o, c_o = ek.linear_forward(a.reshape(b * t, hq * d), p[prefix + "wo"], precision=precision)  # (N, C)
    # the stream gradient this block's backward hands to the FFN before it: its maximum too if FP8 (the
    # layers' FFNs are all FP8 or none: one shape)
    fp8 = ek.is_fp8(p.get(prefix + "w_down"))
    remake = NormRemake(s, p[prefix + "attn_norm"], config.norm_eps) if bf16 and not keep else None
    cache = AttentionBlockCache(
        c_norm, c_qkv, c_q, c_k, c_v, c_rq, c_rk, c_att, c_o, b, t, hq, hkv, d, bf16, fp8, remake
    )
    return (s, o), cache


def attention_block_backward(
    dout: tuple[Any, Any, Any], cache: AttentionBlockCache, prefix: str, bf16_grads: bool = False
) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
    """Gradients of attention_block_forward: dout = (g, g16, amax16), g (N, C) that of s + o, g16 its bf16
    copy or None, amax16 g16's maximum or None -> ((the same three for x and branch), {name: dweight}).
    bf16_grads (bf16 and fp8 products): the projections' weight gradients are bf16 (module docstring)."""
    b, t, hq, hkv, d = cache.batch, cache.seq, cache.n_heads, cache.n_kv_heads, cache.head_dim
    bf16 = cache.bf16
    g, g16, _ = dout
    wide = {"bf16_dweight": bf16_grads}  # the products' weight gradients: float32, or bf16
    # o's gradient is g -> (N, Hq D)
    da, dwo = ek.linear_backward(g if g16 is None else g16, cache.out, bf16_dx=bf16, **wide)
    grads_qkv = list(ek.attention_backward(da.reshape(b, t, hq, d), cache.attention))  # float32 dq, dk, dv
    h = norm_again(cache.remake)  # (N, C) or None (kept by the caches)
    if cache.qkv is not None:  # one product each way; the joint gradient's row blocks are the three weights'
        # the list is emptied: attention's float32 gradients are freed once rounded into the joint one
        dh, dw = ek.qkv_backward(grads_qkv, cache.qkv, x=h, bf16_dx=True, **wide)
        dwq, dwk, dwv = dw[: hq * d], dw[hq * d : (hq + hkv) * d], dw[(hq + hkv) * d :]
    else:
        dq, dk, dv = grads_qkv
        del grads_qkv
        dq = ek.rope_backward(dq, cache.rope_q).reshape(b * t, hq * d)
        dk = ek.rope_backward(dk, cache.rope_k).reshape(b * t, hkv * d)
        # h feeds three projections: their dh add up, in bf16 with bf16 products (each sum rounded once)
        dh, dwv = ek.linear_backward(dv.reshape(b * t, hkv * d), cache.v, x=h, bf16_dx=bf16, **wide)
        dh, dwk = ek.linear_backward(dk, cache.k, dx_into=dh, x=h, **wide)
        dh, dwq = ek.linear_backward(dq, cache.q, dx_into=dh, x=h, **wide)
    del h
    # s reaches the output directly and via h
    dx, dnorm = norm_backward(g, dh, cache.norm, bf16, amax=cache.fp8)
    grads = {"attn_norm": dnorm, "wq": dwq, "wk": dwk, "wv": dwv, "wo": dwo}
    return dx, {prefix + k: g for k, g in grads.items()}


def attention_block_decode(
    config: ModelConfig,
    w: dict,
    prefix: str,
    x: Any,
    state: Any,
    layer: int,
    rope: tuple,
    tree: Any,
    precision: ek.Precision,
) -> Any:
    """attention_block_forward's decode step, T new tokens per row against the static cache (state: a
    decode_state.DecodeState): the stream x (B T, C) -> x + the block's output; the norm rides in the
    joint q/k/v product (w: decode_step.inference_weights) and the addition in the output product.
    rope: the tables, the window and whether attention writes bf16 (see decode_step.decode_logits)."""
    eps = config.norm_eps
    qkv = ek.decode_linear_forward(x, w[prefix + "wqkv"], w[prefix + "attn_norm"], eps, precision=precision)
    b = state.pos.shape[0]  # qkv (B T, (Hq + 2 Hkv) D): q, k, v side by side
    qkv = qkv if qkv.shape[0] == b else qkv.reshape(b, -1, qkv.shape[1])  # T > 1: (B, T, ...)
    k, v = state.k[layer], state.v[layer]  # (B, Hkv, S, D): the new keys and values land at pos[b]..
    cos, sin, window, bf16 = rope  # a: (B, [T,] Hq D), bf16 when the product after it takes bf16
    a = ek.decode_attention_forward(qkv, k, v, state.pos, cos, sin, config.n_heads, window, bf16, tree)
    a = a.reshape(x.shape[0], -1)  # (B T, Hq D)
    return ek.decode_linear_forward(a, w[prefix + "wo"], residual=x, precision=precision)  # (B T, C)


def ffn_block_forward(
    config: ModelConfig,
    p: dict[str, Any],
    prefix: str,
    stream: tuple[Any, Any],
    bf16: bool = False,
    keep: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[tuple[Any, Any], FFNBlockCache]:
    """stream (x, branch) (N, C) -> (s, o): s = x + branch, o = w_down(silu(w_gate h) * w_up h) with
    h = rmsnorm(s); the stream after the block is s + o. keep: the bf16 cache keeps h and the SwiGLU
    product instead of re-making them in the backward; bf16 and precision as in attention_block_forward."""
    fp8 = ek.is_fp8(p[prefix + "w_down"])  # FP8 products: the norm and SwiGLU measure their outputs' maxima
    scaled = p.get(FP8_SCALES) if fp8 else None  # (scales, first slot): delayed scales for SwiGLU's outputs
    delayed = scaled is not None and scaled[0].calibrated
    a_h = ek.fp8_amax() if fp8 else None
    s, h, c_norm = norm_in(config, p[prefix + "ffn_norm"], stream, bf16, amax=a_h)  # (N, C) each
    weights = [p[prefix + "w_gate"], p[prefix + "w_up"]]
    # bf16 re-makes h and gated in the backward unless asked to keep them; FP8 keeps their transposed FP8
    # copies (a byte a value), which saves the re-making passes and the casts of the re-made arrays
    keep = keep or not bf16 or fp8
    gate_up = ek.linear_forward_many(h, weights, bf16, keep, a_h, precision)
    (g, c_gate), (u, c_up) = gate_up  # (N, F) each
    if delayed:  # the product straight to FP8 (rows padded to 16), cast with the slot's delayed scale
        gated8, c_swi = ek.swiglu_forward_fp8(g, u, scaled[0], scaled[1])
        o, c_down = ek.linear_forward(gated8, p[prefix + "w_down"], precision=precision)  # (N, C)
    else:  # without delayed scales, or calibrating them: the maximum goes into the slot for later steps
        a_gated = (ek.fp8_amax() if scaled is None else scaled[0].amax_now[scaled[1]]) if fp8 else None
        gated, c_swi = ek.swiglu_forward(g, u, amax=a_gated)  # (N, F)
        o, c_down = ek.linear_forward(gated, p[prefix + "w_down"], False, keep, a_gated, precision)  # (N, C)
    remake = None if keep else NormRemake(s, p[prefix + "ffn_norm"], config.norm_eps)  # h's (gated's: c_swi)
    return (s, o), FFNBlockCache(c_norm, c_gate, c_up, c_swi, c_down, bf16, fp8, scaled, delayed, remake)


def _swiglu_backward_fp8_or_kept(dgated: Any, c_swi: Any, fp8: bool, scaled: Any, delayed: bool) -> tuple:
    """(dg, du, dg's maximum, du's maximum) of SwiGLU's backward when the forward kept its product: FP8
    outputs with delayed scales (no maxima to hand on), or the kernel that measures the maxima FP8 casts
    need (into the scales' slots while calibrating them), or plain (None, None)."""
    if delayed:  # dgate and dup straight to FP8 with their slots' delayed scales
        scales, slot = scaled
        return (*ek.swiglu_backward_fp8(dgated, c_swi, scales, (slot + 1, slot + 2)), None, None)
    a_dg, a_du = (ek.fp8_amax(), ek.fp8_amax()) if fp8 else (None, None)
    if scaled is not None:  # calibrating: the maxima go into the slots
        a_dg, a_du = scaled[0].amax_now[scaled[1] + 1], scaled[0].amax_now[scaled[1] + 2]
    dg, du = ek.swiglu_backward(dgated, c_swi, amax=None if a_dg is None else (a_dg, a_du))
    return dg, du, a_dg, a_du


def ffn_block_backward(
    dout: tuple[Any, Any, Any], cache: FFNBlockCache, prefix: str, bf16_grads: bool = False
) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
    """Gradients of ffn_block_forward: dout = (g, g16, amax16) and bf16_grads as in
    attention_block_backward -> ((the same three for x and branch), {name: dweight})."""
    bf16, fp8, remake = cache.bf16, cache.fp8, cache.remake
    c_down, c_swi = cache.down, cache.swiglu
    g, g16, a16 = dout
    wide = {"bf16_dweight": bf16_grads}  # the products' weight gradients: float32, or bf16
    d_o = g if g16 is None else g16  # o's gradient is g
    if remake is not None:  # bf16: dgated first; SwiGLU's backward re-makes the product (N, F) in its pass
        dgated, _ = ek.linear_backward(d_o, c_down, bf16_dx=True, dweight=False)
        dg, du, gated = ek.swiglu_backward(dgated, c_swi, product=True)
        del dgated  # three (N, F) arrays alive at once, as when the product was re-made before
        dw_down = ek.linear_weight_grad(d_o, c_down, x=gated, **wide)  # w_down's gradient needs the product
        del gated
        a_dg = a_du = None
    else:
        dgated, dw_down = ek.linear_backward(d_o, c_down, bf16_dx=bf16, dout_amax=a16, **wide)
        dg, du, a_dg, a_du = _swiglu_backward_fp8_or_kept(dgated, c_swi, fp8, cache.scaled, cache.delayed)
    h = norm_again(remake)  # (N, C) or None (kept by the caches)
    bf16_dx = bf16 and not fp8  # dh summed as attention's
    dh, dw_up = ek.linear_backward(du, cache.up, x=h, bf16_dx=bf16_dx, dout_amax=a_du, **wide)
    dh, dw_gate = ek.linear_backward(dg, cache.gate, dx_into=dh, x=h, dout_amax=a_dg, **wide)
    del h
    dx, dnorm = norm_backward(g, dh, cache.norm, bf16)  # s reaches the output directly and via h
    grads = {"ffn_norm": dnorm, "w_gate": dw_gate, "w_up": dw_up, "w_down": dw_down}
    return dx, {prefix + k: g for k, g in grads.items()}


def ffn_block_decode(config: ModelConfig, w: dict, prefix: str, x: Any, precision: ek.Precision) -> Any:
    """ffn_block_forward's decode step, the gate and up projections as one product with the norm and SwiGLU
    fused around it: the stream x (B T, C) -> x + the block's output."""
    norm = w[prefix + "ffn_norm"]
    eps = config.norm_eps
    gated = ek.decode_linear_forward(x, w[prefix + "w_gate_up"], norm, eps, swiglu=True, precision=precision)
    # (B T, C), gated (B T, F)
    return ek.decode_linear_forward(gated, w[prefix + "w_down"], residual=x, precision=precision)


def layer_forward(
    config: ModelConfig,
    p: dict[str, Any],
    i: int,
    stream: tuple[Any, Any],
    bt: tuple[int, int],
    rope: tuple[Any, Any],
    kv: Any = None,
    bf16: bool = False,
    keep: bool = False,
    precision: ek.Precision = ek.EXACT,
) -> tuple[tuple[Any, Any], LayerCache]:
    """Layer i, its attention block then its FFN block: stream (x, branch) (N, C) -> (the stream after
    it, its cache); kv, bf16, keep and precision as in attention_block_forward."""
    prefix = f"layers.{i}."
    p = scaled_branches(p, prefix)
    stream, c_attn = attention_block_forward(config, p, prefix, stream, bt, rope, kv, bf16, keep, precision)
    stream, c_ffn = ffn_block_forward(config, p, prefix, stream, bf16, keep, precision)
    return stream, LayerCache(c_attn, c_ffn)


def layer_backward(
    dout: tuple[Any, Any, Any], cache: LayerCache, i: int, bf16_grads: bool = False
) -> tuple[tuple[Any, Any, Any], dict[str, Any]]:
    """Gradients of layer_forward: dout = (g, g16, amax16), g (N, C) that of the stream after layer i, g16
    its bf16 copy or None and amax16 g16's maximum or None -> (the same three for the stream before it,
    {name: dweight}); bf16_grads as in attention_block_backward."""
    dx, grads = ffn_block_backward(dout, cache.ffn, f"layers.{i}.", bf16_grads)
    dx, g_attn = attention_block_backward(dx, cache.attention, f"layers.{i}.", bf16_grads)
    grads.update(g_attn)
    return dx, scaled_branches(grads, f"layers.{i}.")  # d(s w)/dw = s


def layer_decode(
    config: ModelConfig,
    w: dict[str, Any],
    i: int,
    x: Any,
    state: Any,
    rope: tuple,
    tree: Any,
    precision: ek.Precision,
) -> Any:
    """Layer i's decode step, its attention block then its FFN block (the _decode functions above): the
    stream x (B T, C) -> the stream after it."""
    prefix = f"layers.{i}."
    w = scaled_branches(w, prefix)
    x = attention_block_decode(config, w, prefix, x, state, i, rope, tree, precision)
    return ffn_block_decode(config, w, prefix, x, precision)


def scaled_branches(p: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A layer's weights (or their gradients) as its blocks use them: each block's output projection scaled
    by BRANCH_SCALE, which scales the block's branch (x = x + s attn(rmsnorm(x)), then the FFN's likewise).
    A test-only change to the layer's definition, made here once for training, prefill and decoding
    (tests/model/test_layer_once.py); at 1, the default, p itself (float arrays only otherwise)."""
    if BRANCH_SCALE == 1.0:
        return p
    return {
        **p,
        prefix + "wo": BRANCH_SCALE * p[prefix + "wo"],
        prefix + "w_down": BRANCH_SCALE * p[prefix + "w_down"],
    }
