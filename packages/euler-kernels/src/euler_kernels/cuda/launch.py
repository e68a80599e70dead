"""Python launchers for the CUDA kernels: shapes in, CuPy arrays out. Inputs must be C-contiguous float32."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from euler_kernels.cuda._module import blocks, get_kernel
from euler_kernels.cuda.tables import TableCache

THREADS = 256
GRID_CAP = 132 * 32  # enough blocks to fill an H200's 132 SMs for grid-stride loops


def _contiguous(*arrays: Any) -> list[Any]:
    import cupy

    return [cupy.ascontiguousarray(a) for a in arrays]


def _grid(n: int) -> tuple[int]:
    return (min(blocks(n, THREADS), GRID_CAP),)


# --- rmsnorm ---------------------------------------------------------------------------------------
def _rmsnorm_vec(C: int) -> int:
    """float4 pieces per lane for the vectorised kernels (C = 128 * n, n <= 8), or 0 for the general ones."""
    return C // 128 if C % 128 == 0 and C <= 1024 else 0


def rmsnorm_forward(x: Any, weight: Any, eps: float, bf16_out: bool = False) -> tuple[Any, Any]:
    """x (..., C) -> out (..., C), rstd (N,) with N the number of rows; one warp per row. bf16_out: out is
    bfloat16 (uint16 bit patterns), for a norm whose output only feeds bf16 matrix products."""
    out, rstd, _ = _rmsnorm_forward(x, None, weight, eps, bf16_out)
    return out, rstd


def residual_rmsnorm_forward(
    x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool = False
) -> tuple[Any, Any, Any]:
    """s = x + branch and rmsnorm(s) in one pass: (s, out, rstd)."""
    out, rstd, total = _rmsnorm_forward(x, branch, weight, eps, bf16_out)
    return total, out, rstd


def _rmsnorm_forward(x: Any, branch: Any, weight: Any, eps: float, bf16_out: bool) -> tuple[Any, Any, Any]:
    import cupy

    x, weight = _contiguous(x, weight)
    C = x.shape[-1]
    N = x.size // C
    out = cupy.empty(x.shape, dtype=cupy.uint16 if bf16_out else cupy.float32)
    rstd = cupy.empty((N,), dtype=cupy.float32)
    grid = (min(blocks(N, THREADS // 32), GRID_CAP),)
    add, total = (), None
    if branch is not None:  # the residual connection fused in front: the kernel also writes x + branch
        total = cupy.empty_like(x)
        add = (cupy.ascontiguousarray(branch), total)
    name = "_add" * (branch is not None) + "_bf16" * bf16_out
    if vec := _rmsnorm_vec(C):
        kernel = get_kernel("rmsnorm.cu", "rmsnorm_forward_vec" + name, ROW_F4=vec)
        kernel(grid, (THREADS,), (out, rstd, x, weight, *add, np.int32(N), np.float32(eps)))
    else:
        args = (out, rstd, x, weight, *add, np.int32(N), np.int32(C), np.float32(eps))
        get_kernel("rmsnorm.cu", "rmsnorm_forward" + name)(grid, (THREADS,), args)
    return out, rstd, total


def rmsnorm_backward(dout: Any, x: Any, weight: Any, rstd: Any, dx_add: Any = None) -> tuple[Any, Any]:
    """(dx, dweight); dx_add (like x): a gradient added to dx in the same pass (the residual branch's)."""
    import cupy

    dout, x = _contiguous(dout, x)
    C = x.shape[-1]
    N = x.size // C
    dx = cupy.empty_like(x)
    dweight = cupy.zeros((C,), dtype=cupy.float32)
    grid = (min(blocks(N, THREADS // 32), 132 * 2),)  # few blocks: each adds its dweight once
    add = () if dx_add is None else (cupy.ascontiguousarray(dx_add),)
    suffix = "" if dx_add is None else "_add"
    if vec := _rmsnorm_vec(C):
        kernel = get_kernel("rmsnorm.cu", "rmsnorm_backward_vec" + suffix, ROW_F4=vec)
        kernel(grid, (THREADS,), (dx, dweight, dout, x, weight, rstd, *add, np.int32(N)))
        return dx, dweight
    args = (dx, dweight, dout, x, weight, rstd, *add, np.int32(N), np.int32(C))
    get_kernel("rmsnorm.cu", "rmsnorm_backward" + suffix)(grid, (THREADS,), args, shared_mem=4 * C)
    return dx, dweight


# --- rope ------------------------------------------------------------------------------------------
def rope_rotate(x: Any, cos: Any, sin: Any, offset: int, direction: float, bf16_out: bool = False) -> Any:
    """Rotate x (B, T, H, D) by +angle (direction 1, forward) or -angle (direction -1, backward).

    x is float32 or bfloat16 (uint16 bit patterns); out is bf16 when x is, or when bf16_out is set."""
    import cupy

    x, cos, sin = _contiguous(x, cos, sin)
    _, T, H, D = x.shape
    x_bf16 = x.dtype == cupy.uint16
    out = cupy.empty(x.shape, dtype=cupy.uint16 if x_bf16 or bf16_out else cupy.float32)
    name = "rope_rotate_bf16" if x_bf16 else "rope_rotate_to_bf16" if bf16_out else "rope_rotate"
    n_rows = x.size // D  # (b, t, h) rows
    if n_rows >= 2**31:
        raise ValueError(f"rope_rotate: {n_rows} rows of head vectors exceed the kernel's 32-bit row index")
    args = (out, x, cos, sin, np.int32(n_rows), np.int32(T), np.int32(H), np.int32(D), np.int32(offset))
    rows_per_block = 8  # blocks of (32 pair lanes, 8 rows)
    grid = (min(blocks(n_rows, rows_per_block), GRID_CAP),)
    get_kernel("rope.cu", name)(grid, (32, rows_per_block), (*args, np.float32(direction)))
    return out


# --- swiglu ----------------------------------------------------------------------------------------
def _suffix(a: Any) -> str:
    """Kernel-name suffix for the storage type: "_bf16" for uint16 (bf16 bit patterns), "" for float32."""
    return "_bf16" if a.dtype == np.uint16 else ""


def _swiglu_kernel(name: str, *arrays: Any) -> tuple[Any, int]:
    """The kernel for these arrays' storage and its element count per thread step: bf16 arrays of a size
    divisible by 8, 16-byte aligned, take the 8-wide kernel (16-byte loads)."""
    n = arrays[0].size
    if arrays[0].dtype == np.uint16 and n % 8 == 0 and all(a.data.ptr % 16 == 0 for a in arrays):
        return get_kernel("swiglu.cu", name + "_bf16x8"), n // 8
    return get_kernel("swiglu.cu", name + _suffix(arrays[0])), n


def swiglu_forward(gate: Any, up: Any) -> Any:
    """out = silu(gate) * up; all float32, or all bf16 (uint16 bit patterns)."""
    import cupy

    gate, up = _contiguous(gate, up)
    out = cupy.empty_like(gate)
    kernel, n = _swiglu_kernel("swiglu_forward", out, gate, up)
    kernel(_grid(n), (THREADS,), (out, gate, up, np.int64(n)))
    return out


def swiglu_backward(dout: Any, gate: Any, up: Any) -> tuple[Any, Any]:
    """(dgate, dup) in the storage type of gate, up and dout (all float32 or all bf16)."""
    import cupy

    dout, gate, up = _contiguous(dout, gate, up)
    dgate, dup = cupy.empty_like(gate), cupy.empty_like(up)
    kernel, n = _swiglu_kernel("swiglu_backward", dgate, dup, dout, gate, up)
    kernel(_grid(n), (THREADS,), (dgate, dup, dout, gate, up, np.int64(n)))
    return dgate, dup


# --- embedding -------------------------------------------------------------------------------------
def embedding_backward(dout: Any, tokens: Any, vocab_size: int) -> Any:
    """dout (..., C), tokens (...) -> dweight (V, C), scatter-added with atomics."""
    import cupy

    (dout,) = _contiguous(dout)
    C = dout.shape[-1]
    ids = cupy.ascontiguousarray(tokens.reshape(-1), dtype=cupy.int64)
    dweight = cupy.zeros((vocab_size, C), dtype=cupy.float32)
    args = (dweight, dout, ids, np.int64(ids.size), np.int32(C))
    get_kernel("embedding.cu", "embedding_backward")(_grid(dout.size), (THREADS,), args)
    return dweight


# --- cross-entropy ---------------------------------------------------------------------------------
def _float4_rows(*arrays: Any) -> bool:
    """Whether every (N, V) array can be read as float4: V % 4 == 0 and 16-byte aligned data."""
    return all(a.shape[-1] % 4 == 0 and a.data.ptr % 16 == 0 for a in arrays)


def cross_entropy_forward(logits: Any, targets: Any, weight: Any) -> tuple[Any, Any]:
    """logits (N, V), targets (N,) int64, weight (N,) float32 -> per-row weighted nll (N,), lse (N,)."""
    import cupy

    logits, targets, weight = _contiguous(logits, targets, weight)
    N, V = logits.shape
    nll = cupy.empty((N,), dtype=cupy.float32)
    lse = cupy.empty((N,), dtype=cupy.float32)
    args = (nll, lse, logits, targets, weight, np.int32(V))
    name = "cross_entropy_forward_vec" if _float4_rows(logits) else "cross_entropy_forward"
    get_kernel("cross_entropy.cu", name)((N,), (THREADS,), args)
    return nll, lse


def cross_entropy_backward(
    logits: Any, lse: Any, targets: Any, weight: Any, scale: Any, out: Any = None, bf16_out: bool = False
) -> Any:
    """dlogits (N, V) = scale * weight * (softmax - onehot); `out` may be `logits` itself (in place).
    bf16_out: dlogits is bf16 (uint16 bit patterns), for a head whose products run in bf16."""
    import cupy

    N, V = logits.shape
    if bf16_out and not _float4_rows(logits):  # no bf16 kernel for odd V: round the float32 result
        from euler_kernels.cuda.gemm import to_bf16

        return to_bf16(cross_entropy_backward(logits, lse, targets, weight, scale))
    dtype = cupy.uint16 if bf16_out else cupy.float32
    dlogits = cupy.empty(logits.shape, dtype=dtype) if out is None else out
    args = (dlogits, logits, lse, targets, weight, scale, np.int32(V))
    vec = _float4_rows(logits, dlogits)
    name = "cross_entropy_backward_vec" if vec else "cross_entropy_backward"
    get_kernel("cross_entropy.cu", name + ("_bf16" if bf16_out else ""))((N,), (THREADS,), args)
    return dlogits


# --- multi-tensor AdamW and norms ------------------------------------------------------------------
CHUNK = 8192  # elements per block; must match CHUNK in common.cuh
_tables = TableCache(capacity=32)
keep_tables = _tables.keep  # `with keep_tables() as kept:` pins the tables a CUDA graph is captured with


def _chunk_table(tensors: list[Any]) -> tuple[Any, Any, Any, Any]:
    """Device tables (pointers, chunk->tensor, chunk->start, sizes) for tensors, cached by address."""
    import cupy

    def build() -> tuple[Any, Any, Any, Any]:
        sizes = np.array([t.size for t in tensors], dtype=np.int64)
        n_chunks = (sizes + CHUNK - 1) // CHUNK
        chunk_tensor = np.repeat(np.arange(len(tensors), dtype=np.int32), n_chunks)
        chunk_start = np.concatenate([np.arange(n, dtype=np.int64) * CHUNK for n in n_chunks])
        pointers = np.array([t.data.ptr for t in tensors], dtype=np.uint64)
        return tuple(cupy.asarray(a) for a in (pointers, chunk_tensor, chunk_start, sizes))

    return _tables.get(tuple((t.data.ptr, t.size) for t in tensors), build)


def to_bf16_many(tensors: list[Any]) -> list[Any]:
    """bf16 copies (uint16 bit patterns) of C-contiguous float32 tensors, all made in one launch.

    The copies live in buffers kept per list of tensors (in the same cache as the tables, so a captured
    graph's `keep_tables()` scope keeps them too): every call with the same tensors writes the same
    buffers, so the copies of an earlier call are overwritten, and a CUDA graph can replay the cast.
    """
    import cupy

    def build() -> tuple[list[Any], Any]:
        outs = [cupy.empty(t.shape, dtype=cupy.uint16) for t in tensors]
        return outs, cupy.asarray(np.array([o.data.ptr for o in outs], dtype=np.uint64))

    outs, out_pointers = _tables.get(("bf16 copies", *((t.data.ptr, t.size) for t in tensors)), build)
    in_pointers, chunk_tensor, chunk_start, sizes = _chunk_table(tensors)
    args = (out_pointers, in_pointers, chunk_tensor, chunk_start, sizes)
    get_kernel("cast.cu", "float_to_bf16_multi")((chunk_tensor.size,), (THREADS,), args)
    return outs


def sum_squares_multi(tensors: list[Any]) -> Any:
    """Sum of squares of all elements of all float32 tensors, as a float64 device scalar (shape (1,))."""
    import cupy

    pointers, chunk_tensor, chunk_start, sizes = _chunk_table(tensors)
    partials = cupy.empty((chunk_tensor.size,), dtype=cupy.float64)  # one per chunk
    args = (partials, pointers, chunk_tensor, chunk_start, sizes)
    get_kernel("adamw.cu", "sum_squares_multi")((chunk_tensor.size,), (THREADS,), args)
    out = cupy.empty((1,), dtype=cupy.float64)
    get_kernel("adamw.cu", "sum_partials")((1,), (1024,), (out, partials, np.int32(partials.size)))
    return out


def clip_factor(sum_squares: Any, max_norm: float) -> tuple[Any, Any]:
    """Device scalars (factor, norm): factor = min(1, max_norm / norm), computed without a host sync."""
    import cupy

    factor = cupy.empty((1,), dtype=cupy.float32)
    norm = cupy.empty((1,), dtype=cupy.float32)
    get_kernel("adamw.cu", "clip_factor")((1,), (1,), (factor, norm, sum_squares, np.float32(max_norm)))
    return factor, norm


_decay_tables: dict[tuple, Any] = {}


def _decay_table(weight_decays: list[float]) -> Any:
    """The per-tensor weight decays as a float32 device array, made once per list (no copy per step)."""
    import cupy

    key = tuple(float(d) for d in weight_decays)
    if key not in _decay_tables:
        _decay_tables[key] = cupy.asarray(np.asarray(key, dtype=np.float32))
    return _decay_tables[key]


def _adamw_tables(
    params: list[Any], ms: list[Any], vs: list[Any], grads: list[Any], weight_decays: list[float]
) -> tuple:
    """The eight table arguments both AdamW kernels start with: pointers of params, m, v, grads, the
    decays, chunk -> tensor, chunk -> start, sizes."""
    p_ptr, chunk_tensor, chunk_start, sizes = _chunk_table(params)
    m_ptr, v_ptr, g_ptr = (_chunk_table(ts)[0] for ts in (ms, vs, grads))
    return (p_ptr, m_ptr, v_ptr, g_ptr, _decay_table(weight_decays), chunk_tensor, chunk_start, sizes)


def adamw_multi(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    weight_decays: list[float],
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    grad_scale: Any = None,
) -> None:
    """One launch updates every tensor in place; grad_scale is an optional float32 device scalar."""
    import cupy

    tables = _adamw_tables(params, ms, vs, grads, weight_decays)
    scale = cupy.ones((1,), dtype=cupy.float32) if grad_scale is None else grad_scale
    args = (
        *tables,
        scale,
        np.float32(lr),
        np.float32(beta1),
        np.float32(beta2),
        np.float32(eps),
        np.float32(1 - beta1**step),
        np.float32(1 - beta2**step),
    )
    get_kernel("adamw.cu", "adamw_multi")((tables[5].size,), (THREADS,), args)  # one block per chunk


def step_control(sum_squares: Any, loss: Any, hyper: Any, max_norm: float, out: Any = None) -> Any:
    """Device control vector [grad_scale, apply, lr, bc1, bc2, norm] for `adamw_multi_ctl`.

    sum_squares: float64 (1,) from `sum_squares_multi`; loss: float32 device scalar; hyper: float32 (4,)
    device array [lr, 1 - beta1**t, 1 - beta2**t, enable] written by the host before each step.
    Nothing is read back to the host, so a CUDA graph can replay it with new `hyper` values.
    """
    import cupy

    control = cupy.empty((6,), dtype=cupy.float32) if out is None else out
    args = (control, sum_squares, loss, hyper, np.float32(max_norm))
    get_kernel("adamw.cu", "step_control")((1,), (1,), args)
    return control


def adamw_multi_ctl(
    params: list[Any],
    ms: list[Any],
    vs: list[Any],
    grads: list[Any],
    weight_decays: list[float],
    control: Any,
    beta1: float,
    beta2: float,
    eps: float,
) -> None:
    """`adamw_multi` with the clip factor, lr, bias corrections and a skip flag read from `control`."""
    tables = _adamw_tables(params, ms, vs, grads, weight_decays)
    args = (
        *tables,
        control,
        np.float32(beta1),
        np.float32(beta2),
        np.float32(eps),
    )
    get_kernel("adamw.cu", "adamw_multi_ctl")((tables[5].size,), (THREADS,), args)  # one block per chunk


# --- FlashAttention --------------------------------------------------------------------------------
_TILE = 64


def _attention_smem(head_dim: int, backward: bool, tf32: bool) -> int:
    tile, pad = _TILE, head_dim + 1
    if tf32:  # see flash_attention_tf32.cu: KPAD = D + 4, VPAD = D + 8, PPAD = TILE + 4
        kpad, vpad, ppad = head_dim + 4, head_dim + 8, tile + 4
        if backward:
            return 4 * (4 * tile * kpad + 2 * tile * ppad + 2 * tile)
        return 4 * (2 * tile * kpad + tile * vpad + tile * ppad)
    if backward:
        return 4 * (4 * tile * pad + 2 * tile * (tile + 1) + 2 * tile)
    return 4 * (3 * tile * pad + tile * (tile + 1))


def _attention_kernel(name: str, head_dim: int, backward: bool, tf32: bool):
    if head_dim not in (64, 128):
        raise ValueError(f"flash_attention: head_dim must be 64 or 128 on the GPU, got {head_dim}")
    source = "flash_attention_tf32.cu" if tf32 else "flash_attention.cu"
    kernel = get_kernel(source, name + ("_tf32" if tf32 else ""), HEAD_DIM=head_dim)
    kernel.max_dynamic_shared_size_bytes = _attention_smem(head_dim, backward, tf32)
    return kernel


def tf32_enabled() -> bool:
    """TF32 tensor-core math for float32 matmuls and attention, as CuPy's own CUPY_TF32=1 switch."""
    return os.environ.get("CUPY_TF32", "0") == "1"


def _attention_sizes(q: Any, k: Any, causal: bool) -> tuple:
    """The scalar kernel arguments shared by forward and backward: T, S, Hq, Hkv, scale, causal."""
    _, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    return (np.int32(T), np.int32(S), np.int32(Hq), np.int32(Hkv), np.float32(D**-0.5), np.int32(causal))


def flash_attention_forward(
    q: Any, k: Any, v: Any, causal: bool, tf32: bool | None = None
) -> tuple[Any, Any]:
    """q (B, T, Hq, D), k/v (B, S, Hkv, D) -> out (B, T, Hq, D), lse (B, Hq, T).

    tf32=None follows CUPY_TF32; True runs the tensor-core (TF32) kernel, False the exact-fp32 one.
    """
    import cupy

    tf32 = tf32_enabled() if tf32 is None else tf32
    q, k, v = _contiguous(q, k, v)
    B, T, Hq, D = q.shape
    out = cupy.empty_like(q)
    lse = cupy.empty((B, Hq, T), dtype=cupy.float32)
    kernel = _attention_kernel("flash_attention_forward", D, backward=False, tf32=tf32)
    args = (out, lse, q, k, v, *_attention_sizes(q, k, causal))
    threads = 128 if tf32 else 256
    kernel((blocks(T, _TILE), Hq, B), (threads,), args, shared_mem=_attention_smem(D, False, tf32))
    return out, lse


def flash_attention_backward(
    dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, causal: bool, tf32: bool | None = None
) -> tuple[Any, Any, Any]:
    import cupy

    tf32 = tf32_enabled() if tf32 is None else tf32
    dout, q, k, v, out = _contiguous(dout, q, k, v, out)
    B, T, Hq, D = q.shape
    S, Hkv = k.shape[1], k.shape[2]
    delta = cupy.empty((B, Hq, T), dtype=cupy.float32)
    n_rows = B * T * Hq
    delta_kernel = get_kernel("flash_attention.cu", "flash_attention_delta", HEAD_DIM=D)
    delta_args = (delta, dout, out, np.int32(T), np.int32(Hq), np.int64(n_rows))
    delta_kernel((blocks(n_rows * 32, THREADS),), (THREADS,), delta_args)
    dq = cupy.zeros_like(q)
    dk, dv = cupy.empty_like(k), cupy.empty_like(v)
    kernel = _attention_kernel("flash_attention_backward", D, backward=True, tf32=tf32)
    args = (dq, dk, dv, q, k, v, dout, lse, delta, *_attention_sizes(q, k, causal))
    threads = 128 if tf32 else 256
    kernel((blocks(S, _TILE), Hkv, B), (threads,), args, shared_mem=_attention_smem(D, True, tf32))
    return dq, dk, dv
