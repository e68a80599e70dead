"""Linear layer without bias; weight layout (C_out, C_in) as in PyTorch: out = x @ weight.T."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from euler_kernels import cuda
from euler_kernels.backend import bf16_bits, check_float, is_bf16, shape_error
from euler_kernels.cuda import cast
from euler_kernels.matmul import gemm
from euler_kernels.matmul.linear_fp8 import LinearFp8Cache, backward_fp8, forward_fp8, is_fp8
from euler_kernels.precision import EXACT, Precision


class LinearCache(NamedTuple):
    """linear_forward's cache of a product in the operands' own type: NumPy, or float32 / float64 CuPy
    (cuBLAS in the precision's matmul)."""

    x: Any  # (..., C_in); None: keep_input=False (the backward is handed x again)
    weight: Any  # (C_out, C_in)
    precision: Precision  # the backward's products follow the forward's


class LinearBf16Cache(NamedTuple):
    """linear_forward's cache of a bf16 product (GPU): the operands as rounded once, for both backward
    products."""

    x16: Any  # (N, C_in) bf16; None: keep_input=False (the backward is handed x again)
    w16: Any  # (C_out, C_in) bf16
    x_shape: tuple  # x's (..., C_in)
    w_shape: tuple  # (C_out, C_in)
    tuned: bool  # the products may take a tuned cuBLASLt algorithm


def linear_forward(
    x: Any,
    weight: Any,
    bf16_out: bool = False,
    keep_input: bool = True,
    x_amax: Any = None,
    precision: Precision = EXACT,
) -> tuple[Any, LinearCache | LinearBf16Cache | LinearFp8Cache]:
    """out (..., C_out) = x (..., C_in) @ weight.T, weight (C_out, C_in).

    precision (GPU): how float32 CuPy operands are multiplied (its matmul: fp32, tf32, bf16, bf16fast,
    fp8 as bf16) and whether bf16 products may take a tuned cuBLASLt algorithm; the backward follows the
    forward's. On the GPU x, or the weight (a bf16 copy made once per step, e.g. by to_bf16_many), may be
    bf16 (backend.is_bf16): the product then runs on the bf16 tensor cores whatever the precision, and
    dweight is still float32. bf16_out (GPU, bf16 products only): out is a bf16 activation.
    keep_input=False: the cache does not hold x (activation recomputation: the caller re-makes x and
    hands it to linear_backward, which then gives the same gradients bit for bit).
    An FP8 weight copy (linear_fp8.fp8_weights) runs the FP8 path (linear_fp8.py): its cache keeps
    x's FP8 copy, or with keep_input=False only x's absolute maximum; x_amax (FP8 path only): that
    maximum, when the kernel that made x measured it (`fp8_amax`), saving the cast a pass over x.

    >>> import numpy as np
    >>> out, _ = linear_forward(np.array([[1.0, 2.0]]), np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]))
    >>> out.tolist()
    [[1.0, 3.0, 4.0]]
    """
    if type(x) is np.ndarray and type(weight) is np.ndarray:  # NumPy: exact products whatever the precision
        _check(x, weight)
        if bf16_out:
            raise ValueError("linear_forward: bf16_out needs a bf16 product (GPU, a bf16 precision)")
        return x @ weight.T, LinearCache(x if keep_input else None, weight, precision)  # (..., C_out)
    x, weight = bf16_bits(x), bf16_bits(weight)  # a CuPy bfloat16 array as its bit patterns
    if is_fp8(weight):
        return forward_fp8(x, [weight], bf16_out, keep_input, x_amax)[0]
    _check(x, weight)
    if _bf16_product(x, weight, precision):  # round x and weight once; the backward reuses both
        return _forward_bf16(x, [weight], bf16_out, keep_input, precision)[0]
    if bf16_out:
        raise ValueError("linear_forward: bf16_out needs a bf16 product (GPU, a bf16 precision)")
    kept = x if keep_input else None
    if cuda.float32_on_gpu(x, weight):  # cuBLAS called directly: capturable in a CUDA graph
        x2 = _c(x.reshape(-1, weight.shape[1]))  # (N, C_in)
        out = gemm.gemm(x2, _c(weight), trans_b=True, matmul=precision.matmul, tuned=precision.gemm_tuning)
        return out.reshape(*x.shape[:-1], weight.shape[0]), LinearCache(kept, weight, precision)
    out = x @ weight.T  # (..., C_out)
    return out, LinearCache(kept, weight, precision)


def linear_forward_many(
    x: Any,
    weights: list[Any],
    bf16_out: bool = False,
    keep_input: bool = True,
    x_amax: Any = None,
    precision: Precision = EXACT,
) -> list[tuple[Any, LinearCache | LinearBf16Cache | LinearFp8Cache]]:
    """[linear_forward(x, w) for w in weights], with x rounded to bf16 once for all of them in bf16 mode
    on the GPU (and that one copy shared by their caches), e.g. the q, k and v projections of one h.

    >>> import numpy as np
    >>> [out.tolist() for out, _ in linear_forward_many(np.array([[1.0, 2.0]]), [np.eye(2), 2 * np.eye(2)])]
    [[[1.0, 2.0]], [[2.0, 4.0]]]
    """
    if type(x) is np.ndarray:  # NumPy (or a mix, which linear_forward refuses): nothing shared
        return [linear_forward(x, w, bf16_out, keep_input, precision=precision) for w in weights]
    x, weights = bf16_bits(x), [bf16_bits(w) for w in weights]  # a CuPy bfloat16 array as its bit patterns
    if weights and all(is_fp8(w) for w in weights):  # x cast to FP8 once for all of them
        return forward_fp8(x, weights, bf16_out, keep_input, x_amax)
    if not (weights and all(not is_fp8(w) and _bf16_product(x, w, precision) for w in weights)):
        # each call checks its weight
        return [linear_forward(x, w, bf16_out, keep_input, precision=precision) for w in weights]
    for w in weights:
        _check(x, w)
    return _forward_bf16(x, weights, bf16_out, keep_input, precision)


def _bf16_product(x: Any, weight: Any, precision: Precision) -> bool:
    """Whether x @ weight.T runs on the bf16 tensor cores: x or weight is bf16, or both are float32 CuPy
    arrays under a bf16 precision (fp8: the products without an FP8 weight)."""
    return is_bf16(x) or is_bf16(weight) or (precision.bf16 and cuda.float32_on_gpu(x, weight))


def _check(x: Any, weight: Any) -> None:
    if type(x) is not np.ndarray and (
        is_bf16(x) or is_bf16(weight)
    ):  # the other one: bf16 too, or a float32 CuPy array
        for name, a in (("x", x), ("weight", weight)):
            if not (is_bf16(a) or cuda.float32_on_gpu(a)):
                raise ValueError(f"linear_forward: with a bf16 operand, {name} must be bf16 or float32 CuPy")
    else:
        check_float("linear_forward", x=x, weight=weight)
    if weight.ndim != 2 or x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise shape_error(
            "linear_forward", "weight must be (C_out, C_in) with C_in = x.shape[-1]", x=x, weight=weight
        )


def _forward_bf16(
    x: Any, weights: list[Any], bf16_out: bool, keep_input: bool, precision: Precision
) -> list[tuple[Any, LinearBf16Cache]]:
    """GPU bf16 mode: x rounded once (unless it is bf16 already), each weight once; the caches keep the
    bf16 copies for backward (x's unless keep_input is False), and whether the products are tuned."""
    x16 = cast.as_bf16(x.reshape(-1, x.shape[-1]))  # (N, C_in)
    tuned = precision.gemm_tuning
    results = []
    for w in weights:
        w16 = cast.as_bf16(w)
        out = gemm.gemm_bf16(x16, w16, trans_b=True, bf16_out=bf16_out, tuned=tuned)  # (N, C_out)
        cache = LinearBf16Cache(x16 if keep_input else None, w16, x.shape, w.shape, tuned)
        results.append((out.reshape(*x.shape[:-1], w.shape[0]), cache))
    return results


def _c(a: Any) -> Any:
    return a if a.flags.c_contiguous else a.copy()


def linear_backward(
    dout: Any,
    cache: LinearCache | LinearBf16Cache | LinearFp8Cache,
    dx_into: Any = None,
    bf16_dx: bool = False,
    x: Any = None,
    dout_amax: Any = None,
    dweight: bool = True,
    bf16_dweight: bool = False,
) -> tuple[Any, Any]:
    """Gradients (dx (..., C_in), dweight (C_out, C_in)).

    x: the forward's input, re-made, when the forward did not keep it (keep_input=False); the same array
    the forward took gives the same gradients bit for bit.
    dweight=False (bf16 and float32 products): dx alone, (dx, None), without x; `linear_weight_grad` gives
    dweight later (so a kernel that takes dx can re-make x on the way).

    dx_into: an earlier dx of the same shape (say, of another projection of the same input): this dx is
    added into it in place and it is returned, so the sum costs no extra pass (on the GPU cuBLAS adds the
    product straight into it).
    bf16 products (GPU): dout may be a bf16 activation; bf16_dx makes dx one, and a bf16 dx_into (an
    earlier bf16_dx) takes the sum rounded to bf16 once (cuBLAS adds in float32, then rounds).
    dout_amax (FP8 path only): dout's absolute maximum from the kernel that made it, as linear_forward's
    x_amax.
    bf16_dweight (bf16 and FP8 products): dweight is bf16, the float32 sums rounded once as cuBLAS writes
    them (what autocast's weight gradients are before their cast to float32; half the bytes to write, and
    for the optimizer to read).
    """
    if dx_into is not None and not dx_into.flags.c_contiguous:
        raise ValueError("linear_backward: dx_into must be a C-contiguous array")
    kind = type(cache)
    if kind is LinearCache and type(dout) is np.ndarray:  # NumPy: the products as they are
        return _backward_exact(dout, cache, dx_into, x, dweight, bf16_dx, bf16_dweight)
    dout, dx_into = bf16_bits(dout), bf16_bits(dx_into)  # a CuPy bfloat16 array as its bit patterns
    into16 = dx_into is not None and is_bf16(dx_into)
    if bf16_dx and (dx_into is not None or kind is LinearCache):
        raise ValueError("linear_backward: bf16_dx needs a bf16 forward and no dx_into")
    if into16 and kind is not LinearBf16Cache:
        raise ValueError("linear_backward: a bf16 dx_into needs a bf16 product (the bf16 mode's)")
    if kind is LinearFp8Cache:
        if not dweight:
            raise ValueError("linear_backward: dweight=False is for bf16 and float32 products, not FP8")
        x_shape = cache.x_shape
        _check_into(dx_into, x_shape)
        x_again = None if cache.x8 is not None else _input_again(x, x_shape)  # the forward kept no FP8 x
        return backward_fp8(dout, cache, dx_into, bf16_dx, x_again, dout_amax, bf16_dweight)
    if kind is LinearBf16Cache:  # bf16 on the GPU: dout is rounded once and feeds both products
        w16, x_shape, w_shape, tuned = cache.w16, cache.x_shape, cache.w_shape, cache.tuned
        if dout.shape != (*x_shape[:-1], w_shape[0]):
            raise ValueError(
                f"linear_backward: dout{tuple(dout.shape)} must be x.shape[:-1] + ({w_shape[0]},)"
            )
        _check_into(dx_into, x_shape)
        d16 = cast.as_bf16(dout.reshape(-1, w_shape[0]))  # (N, C_out)
        into = None if dx_into is None else dx_into.reshape(-1, w_shape[1])
        dx = gemm.gemm_bf16(d16, w16, out=into, bf16_out=bf16_dx or into16, tuned=tuned).reshape(x_shape)
        dx = dx if dx_into is None else dx_into
        return dx, (linear_weight_grad(d16, cache, x, bf16_dweight) if dweight else None)
    return _backward_exact(dout, cache, dx_into, x, dweight, bf16_dx, bf16_dweight)


def _backward_exact(
    dout: Any, cache: LinearCache, dx_into: Any, x: Any, dweight: bool, bf16_dx: bool, bf16_dweight: bool
) -> tuple:
    """linear_backward of a float32 or float64 forward (NumPy, or cuBLAS in the forward's precision)."""
    if bf16_dx:
        raise ValueError("linear_backward: bf16_dx needs a bf16 forward and no dx_into")
    if bf16_dweight:
        raise ValueError("linear_backward: bf16_dweight needs a bf16 or FP8 product (GPU, bf16 or fp8 mode)")
    kept, weight, precision = cache.x, cache.weight, cache.precision
    if kept is None and x is None and not dweight:  # dx alone: its shape from dout's
        x_shape = (*dout.shape[:-1], weight.shape[1])
    else:
        x_shape = (kept if kept is not None else _input_again(x, None)).shape
    if dout.shape != (*x_shape[:-1], weight.shape[0]):
        raise shape_error("linear_backward", "dout must be x.shape[:-1] + (C_out,)", dout=dout, weight=weight)
    _check_into(dx_into, x_shape)
    d2 = dout.reshape(-1, weight.shape[0])  # (N, C_out)
    host = type(dout) is np.ndarray
    if not host and cuda.float32_on_gpu(dout, weight) and (dx_into is None or cuda.float32_on_gpu(dx_into)):
        into = None if dx_into is None else dx_into.reshape(-1, weight.shape[1])
        mode, tuned = precision.matmul, precision.gemm_tuning
        dx = gemm.gemm(_c(d2), _c(weight), matmul=mode, out=into, tuned=tuned).reshape(x_shape)  # (..., C_in)
        dx = dx if dx_into is None else dx_into
    else:
        dx = dout @ weight  # (..., C_in)
        if dx_into is not None:
            dx_into += dx
            dx = dx_into
    return dx, (linear_weight_grad(dout, cache, x) if dweight else None)


def linear_weight_grad(
    dout: Any, cache: LinearCache | LinearBf16Cache, x: Any = None, bf16_dweight: bool = False
) -> Any:
    """dweight (C_out, C_in) = dout^T x of a bf16 or float32 linear_forward (what linear_backward returns
    beside dx); x: the forward's input, re-made, when the forward did not keep it; bf16_dweight (bf16
    products): dweight rounded to bf16 as linear_backward's."""
    if type(cache) is LinearFp8Cache:
        raise ValueError("linear_weight_grad: FP8 products take linear_backward")
    if type(dout) is not np.ndarray:
        dout, x = bf16_bits(dout), bf16_bits(x)  # a CuPy bfloat16 array as its bit patterns
    if type(cache) is LinearBf16Cache:  # bf16 on the GPU: both operands rounded as the forward rounded them
        x16, x_shape, w_shape, tuned = cache.x16, cache.x_shape, cache.w_shape, cache.tuned
        if x16 is None:  # a bf16 x is taken as it is
            x16 = cast.as_bf16(_input_again(x, x_shape).reshape(-1, x_shape[-1]))
        d16 = cast.as_bf16(dout.reshape(-1, w_shape[0]))  # (N, C_out)
        return gemm.gemm_bf16(d16, x16, trans_a=True, bf16_out=bf16_dweight, tuned=tuned)
    if bf16_dweight:
        raise ValueError("linear_weight_grad: bf16_dweight needs a bf16 product (the GPU's bf16 mode)")
    kept, weight, precision = cache.x, cache.weight, cache.precision
    x = kept if kept is not None else _input_again(x, None)
    if dout.shape != (*x.shape[:-1], weight.shape[0]):
        raise shape_error(
            "linear_weight_grad", "dout must be x.shape[:-1] + (C_out,)", dout=dout, x=x, weight=weight
        )
    d2 = dout.reshape(-1, weight.shape[0])  # (N, C_out)
    x2 = x.reshape(-1, weight.shape[1])  # (N, C_in)
    if type(dout) is not np.ndarray and cuda.float32_on_gpu(dout, x, weight):
        return gemm.gemm(_c(d2), _c(x2), trans_a=True, matmul=precision.matmul, tuned=precision.gemm_tuning)
    return d2.T @ x2  # (C_out, C_in)


def _input_again(x: Any, x_shape: Any) -> Any:
    """The forward's input handed back to linear_backward for a cache that does not hold it (x_shape: the
    shape it must have, where the cache knows it)."""
    if x is None:
        raise ValueError("linear_backward: the forward kept no input (keep_input=False): pass it as x")
    if x_shape is not None and tuple(x.shape) != tuple(x_shape):
        raise ValueError(f"linear_backward: x{tuple(x.shape)} must be the forward's input, {tuple(x_shape)}")
    return x


def _check_into(dx_into: Any, x_shape: tuple) -> None:
    if dx_into is not None and tuple(dx_into.shape) != tuple(x_shape):
        raise ValueError(
            f"linear_backward: dx_into{tuple(dx_into.shape)} must have x's shape {tuple(x_shape)}"
        )
