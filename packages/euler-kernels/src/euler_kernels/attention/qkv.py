"""The attention block's q, k and v from one product: x @ [wq; wk; wv].T, then RoPE on the q and k heads
where they lie in the product's rows.

One product of the joint (W, C) weight, W = (Hq + 2 Hkv) D, runs the narrow k and v projections at the wide
product's rate, and so do their dx and dweight products in the backward: a narrow product runs well below a
wide one's rate (docs/benchmarks/train_gpu.md times the three products against the one). A bf16 step keeps the
three weights' copies one after another in one allocation (`to_bf16_many`), so the joint weight is a view
(`stacked_rows`), and dweight comes back joint: its row blocks are the three weights' gradients.

q, k and v are views of one (B, T, Hq + 2 Hkv, D) array: heads of a wider row, which the GPU's RoPE rotates in
place and Hopper's attention reads where they lie (through its tensor maps). The backward writes dq and dk
rotated back, and dv, into the columns of one gradient array that the two products read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from euler_kernels.backend import bf16_bits, get_array_module, is_bf16, shape_error
from euler_kernels.cuda import cast
from euler_kernels.matmul.linear import (
    LinearBf16Cache,
    LinearCache,
    LinearFp8Cache,
    linear_backward,
    linear_forward,
)
from euler_kernels.precision import EXACT, Precision
from euler_kernels.rope.rope import RoPECache, RoPEKernelCache, rope_backward, rope_forward


class QKVCache(NamedTuple):
    """qkv_forward's cache: the joint product's and the two rotations', and the heads' sizes."""

    linear: LinearCache | LinearBf16Cache | LinearFp8Cache  # x @ [wq; wk; wv].T
    rope_q: RoPECache | RoPEKernelCache
    rope_k: RoPECache | RoPEKernelCache
    batch: int  # B
    seq: int  # T
    n_heads: int  # Hq
    n_kv_heads: int  # Hkv
    head_dim: int  # D
    bf16: bool  # the product's rows are bf16 (so is the gradient the backward writes into them)


def qkv_forward(
    x: Any,
    weight: Any,
    n_heads: int,
    n_kv_heads: int,
    bt: tuple[int, int],
    cos: Any,
    sin: Any,
    offset: int = 0,
    bf16_out: bool = False,
    keep_input: bool = True,
    precision: Precision = EXACT,
) -> tuple[tuple[Any, Any, Any], QKVCache]:
    """x (N, C), N = B * T, weight (W, C), its rows wq's, then wk's, then wv's -> ((q, k, v), cache):
    q (B, T, Hq, D) and k (B, T, Hkv, D) rotated at positions offset .. offset + T - 1, v (B, T, Hkv, D),
    views of one (B, T, Hq + 2 Hkv, D) array. bf16_out, keep_input and precision as in linear_forward
    (bf16_out: the GPU's bf16 products; keep_input=False: linear_backward takes x again).

    >>> import numpy as np
    >>> from euler_kernels.rope.rope import rope_tables
    >>> cos, sin = rope_tables(2, 4, dtype=np.float64)
    >>> (q, k, v), _ = qkv_forward(np.ones((2, 1)), np.array([[1.0], [2.0], [3.0], [4.0], [5.0], [6.0]]),
    ...                            1, 1, (1, 2), cos, sin)
    >>> q.shape, k.shape, v[0, :, 0].tolist()
    ((1, 2, 1, 2), (1, 2, 1, 2), [[5.0, 6.0], [5.0, 6.0]])
    """
    b, t = bt
    heads = n_heads + 2 * n_kv_heads
    if n_kv_heads < 1 or n_heads < 1 or n_heads % n_kv_heads:
        groups = f"n_heads ({n_heads}) must be a multiple of n_kv_heads ({n_kv_heads}) >= 1"
        raise ValueError(f"qkv_forward: {groups}")
    if weight.ndim != 2 or weight.shape[0] % heads or x.ndim != 2 or x.shape[0] != b * t:
        raise shape_error(
            "qkv_forward",
            f"x must be (B * T, C) = ({b * t}, C) and weight ((Hq + 2 Hkv) D, C) with Hq + 2 Hkv = {heads}",
            x=x,
            weight=weight,
        )
    d = weight.shape[0] // heads
    out, c_lin = linear_forward(x, weight, bf16_out, keep_input, precision=precision)  # (N, W)
    rows = out.reshape(b, t, heads, d)
    q, k, v = rows[:, :, :n_heads], rows[:, :, n_heads : heads - n_kv_heads], rows[:, :, heads - n_kv_heads :]
    _, c_rq = rope_forward(q, cos, sin, offset, in_place=True)
    _, c_rk = rope_forward(k, cos, sin, offset, in_place=True)
    return (q, k, v), QKVCache(c_lin, c_rq, c_rk, b, t, n_heads, n_kv_heads, d, is_bf16(out))


def qkv_backward(
    dout: tuple[Any, Any, Any],
    cache: QKVCache,
    x: Any = None,
    bf16_dx: bool = False,
    bf16_dweight: bool = False,
) -> tuple[Any, Any]:
    """dout = (dq, dk, dv), shaped as q, k, v -> (dx (N, C), dweight (W, C), whose row blocks are wq's, wk's
    and wv's gradients). x: the forward's input again when it did not keep it; bf16_dx and bf16_dweight as
    in linear_backward. A bf16 forward takes dq, dk and dv in float32 (as attention's backward writes them) or
    bf16, and rounds them once, into the gradient the products read.

    dout may be a list: it is emptied, so that arrays only it holds are freed once they are written into that
    gradient, before the products (attention's float32 dq alone is 64 MiB at the 856M preset's batch).

    >>> import numpy as np
    >>> from euler_kernels.rope.rope import rope_tables
    >>> cos, sin = rope_tables(2, 4, dtype=np.float64)
    >>> _, cache = qkv_forward(np.ones((2, 1)), np.ones((6, 1)), 1, 1, (1, 2), cos, sin)
    >>> grads = [np.ones((1, 2, 1, 2))] * 3
    >>> dx, dweight = qkv_backward(grads, cache)
    >>> grads, dx.shape, dweight.shape
    ([], (2, 1), (6, 1))
    """
    dq, dk, dv = (bf16_bits(g) for g in dout)  # a CuPy bfloat16 array as its bit patterns
    if isinstance(dout, list):
        dout.clear()
    b, t, hq, hkv, d = cache.batch, cache.seq, cache.n_heads, cache.n_kv_heads, cache.head_dim
    bf16 = cache.bf16
    if dq.shape != (b, t, hq, d) or dk.shape != (b, t, hkv, d) or dv.shape != (b, t, hkv, d):
        raise shape_error(
            "qkv_backward", f"dq must be {(b, t, hq, d)}, dk and dv {(b, t, hkv, d)}", dq=dq, dk=dk, dv=dv
        )
    xp = get_array_module(dq)
    drows = xp.empty((b, t, hq + 2 * hkv, d), dtype=xp.uint16 if bf16 else dq.dtype)  # the product's rows
    rope_backward(dq, cache.rope_q, out=drows[:, :, :hq])
    rope_backward(dk, cache.rope_k, out=drows[:, :, hq : hq + hkv])
    if bf16 and not is_bf16(dv):  # rounded straight into its columns
        v_columns = drows.reshape(b * t, -1)[:, (hq + hkv) * d :]  # (N, Hkv D), rows (Hq + 2 Hkv) D apart
        cast.to_bf16(xp.ascontiguousarray(dv).reshape(b * t, hkv * d), out=v_columns)
    else:
        drows[:, :, hq + hkv :] = dv
    del dq, dk, dv  # written into drows
    c_lin = cache.linear
    return linear_backward(drows.reshape(b * t, -1), c_lin, x=x, bf16_dx=bf16_dx, bf16_dweight=bf16_dweight)
