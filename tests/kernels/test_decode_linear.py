"""decode_linear_forward (the norm in front of a product, SwiGLU or the residual addition after it) against
a float64 reference written out here. The CPU runs the op's unfused path; the GPU tests run the kernels
(decode_linear.cu for float32 weights, decode_linear_mma.cu on the tensor cores for bf16) for 1 to 32 rows,
the decode step's shapes and ragged ones, check that more rows (up to 128, in launches of 8 or 32) give
each row's own bits, which kernel the rule picks, and that still more rows, or a misaligned weight or x,
go to the unfused path."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.cuda import cast
from euler_kernels.matmul import decode_linear_cuda

EPS = 1e-5


def round_bf16(a: np.ndarray) -> np.ndarray:
    """float64 values rounded to the nearest bfloat16 (half to even), as float64."""
    bits = np.asarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def expected(x, w, norm=None, residual=None, swiglu=False, bf16=False):
    """The op's result in float64; bf16: the operand and the gate/up sums rounded as the bf16 path does."""
    h = x.astype(np.float64)
    if norm is not None:
        h = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + EPS) * norm
    if bf16:
        h = round_bf16(h)
    y = h @ w.astype(np.float64).T
    if swiglu:
        f = w.shape[0] // 2
        gate, up = (round_bf16(y[:, :f]), round_bf16(y[:, f:])) if bf16 else (y[:, :f], y[:, f:])
        y = gate / (1.0 + np.exp(-gate)) * up
    return y if residual is None else residual + y


def inputs(rng, rows, k, n, swiglu, dtype=np.float64):
    cols = n // 2 if swiglu else n
    x = rng.standard_normal((rows, k)).astype(dtype)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(dtype)
    norm = (1.0 + 0.3 * rng.standard_normal(k)).astype(dtype)
    residual = rng.standard_normal((rows, cols)).astype(dtype)
    return x, w, norm, residual


FUSIONS = [  # (norm, residual, swiglu): the decode step's three uses, and the plain product
    (True, False, False),
    (False, True, False),
    (True, False, True),
    (False, False, False),
]


@pytest.mark.parametrize(("use_norm", "use_residual", "swiglu"), FUSIONS)
def test_the_unfused_path_equals_float64(use_norm, use_residual, swiglu) -> None:
    rng = np.random.default_rng(0)
    x, w, norm, residual = inputs(rng, 3, 24, 10, swiglu)
    kw = {"norm": norm if use_norm else None, "residual": residual if use_residual else None}
    got = ek.decode_linear_forward(x, w, eps=EPS, swiglu=swiglu, **kw)
    np.testing.assert_allclose(got, expected(x, w, swiglu=swiglu, **kw), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rows", [2, 5, 8, 13])
@pytest.mark.parametrize(("use_norm", "use_residual", "swiglu"), FUSIONS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numpy_rows_are_the_one_row_results_bit_for_bit(rows, use_norm, use_residual, swiglu, dtype) -> None:
    """Up to 128 rows on NumPy are products of one row each, so a speculative step's rows decode exactly as
    a plain step's row does."""
    rng = np.random.default_rng(rows + 5)
    x, w, norm, residual = inputs(rng, rows, 96, 160, swiglu, dtype)
    norm, residual = (norm if use_norm else None), (residual if use_residual else None)
    assert_rows_are_the_one_row_results(x, w, norm, residual, swiglu)


def assert_rows_are_the_one_row_results(x, w, norm, residual, swiglu) -> None:
    """decode_linear_forward of the R rows together equals, bit for bit, each row's call on its own."""
    together = ek.decode_linear_forward(x, w, norm=norm, eps=EPS, residual=residual, swiglu=swiglu)
    for r in range(x.shape[0]):
        res = None if residual is None else residual[r : r + 1]
        alone = ek.decode_linear_forward(x[r : r + 1], w, norm=norm, eps=EPS, residual=res, swiglu=swiglu)
        np.testing.assert_array_equal(ek.to_numpy(together[r : r + 1]), ek.to_numpy(alone))


def test_bad_shapes_are_named() -> None:
    x, w, norm, residual = inputs(np.random.default_rng(1), 2, 8, 6, False)
    with pytest.raises(ValueError, match=r"decode_linear_forward: needs x \(R, K\).*x\(2, 7\)"):
        ek.decode_linear_forward(x[:, :7], w)
    with pytest.raises(ValueError, match="norm"):
        ek.decode_linear_forward(x, w, norm=norm[:3])
    with pytest.raises(ValueError, match="residual"):
        ek.decode_linear_forward(x, w, residual=residual, swiglu=True)  # residual must be (R, N/2)
    with pytest.raises(ValueError, match="N even with swiglu"):
        ek.decode_linear_forward(x, w[:5], swiglu=True)


# (rows, K, N): the gpu preset's products (K 768: q/k/v 1280, gate/up 4096; K 2048: down 768; head 4096)
# for one row (each warp norms it) and several (h staged in shared memory: 5 x 2048 float32 is 40 KB), a
# ragged K (not a multiple of a warp's 32 pieces) and N (a partly used block of 8 columns)
GPU_SHAPES = [(1, 768, 1280), (4, 768, 4096), (5, 2048, 768), (1, 2048, 768), (3, 200, 74), (2, 1000, 37 * 2)]
# bf16 adds 32 rows (one full launch of decode_linear_mma.cu), K 800 (25 chunks: the warps' shares differ),
# 37 columns (a partly used tile of 16) and K 4096 (launches of 16 rows: 32 would not fit its shared memory)
BF16_SHAPES = [(1, 768, 1280), (4, 768, 4096), (8, 2048, 768), (1, 2048, 768), (32, 768, 1280)]
BF16_SHAPES += [(32, 2048, 768), (7, 800, 74), (20, 4096, 48)]


def _gpu(cp, *arrays):
    return [None if a is None else cp.asarray(a) for a in arrays]


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "k", "n"), GPU_SHAPES)
@pytest.mark.parametrize(("use_norm", "use_residual", "swiglu"), FUSIONS)
def test_the_kernel_with_float32_weights_equals_float64(rows, k, n, use_norm, use_residual, swiglu) -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(rows * k + n)
    x, w, norm, residual = inputs(rng, rows, k, n, swiglu, np.float32)
    norm, residual = (norm if use_norm else None), (residual if use_residual else None)
    gx, gw, gnorm, gres = _gpu(cp, x, w, norm, residual)
    assert decode_linear_cuda.decode_linear_fits(gx, gw, gnorm)
    got = ek.decode_linear_forward(gx, gw, norm=gnorm, eps=EPS, residual=gres, swiglu=swiglu)
    assert got.dtype == np.float32
    want = expected(x, w, norm, residual, swiglu)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=2e-5, atol=2e-5)


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "k", "n"), BF16_SHAPES)
@pytest.mark.parametrize(("use_norm", "use_residual", "swiglu"), FUSIONS)
@pytest.mark.parametrize("x_bf16", [False, True])
def test_the_kernel_with_bf16_weights_equals_float64(rows, k, n, use_norm, use_residual, swiglu, x_bf16):
    """bf16 weights: the operand is rounded to bf16 (an x given as bf16 already is), so are the gate and up
    sums; the reference rounds at the same places, so only summation order and the rare bf16 rounding it
    flips differ."""
    cp = pytest.importorskip("cupy")
    if swiglu and k > 2048:
        pytest.skip("gate and up rows of K 4096 are more than a kernel holds: the unfused ops run them")
    rng = np.random.default_rng(7 + rows)
    x, w, norm, residual = inputs(rng, rows, k, n, swiglu, np.float32)
    if x_bf16:
        x, norm = round_bf16(x).astype(np.float32), None  # a bf16 activation is a product's input as it is
    w = round_bf16(w).astype(np.float32)
    norm, residual = (norm if use_norm else None), (residual if use_residual else None)
    gx, gw, gnorm, gres = _gpu(cp, x, w, norm, residual)
    gx, gw = (cast.to_bf16(gx) if x_bf16 else gx), cast.to_bf16(gw)
    assert decode_linear_cuda.decode_linear_fits(gx, gw, gnorm, swiglu)
    got = ek.decode_linear_forward(gx, gw, norm=gnorm, eps=EPS, residual=gres, swiglu=swiglu)
    got = cp.asnumpy(got)
    want = expected(x, w, norm, residual, swiglu, bf16=True)
    near = want if norm is None else expected_for_rstd_within_2_ulp(x, w, norm, residual, swiglu, got)
    close = np.isclose(got, near, rtol=1e-4, atol=1e-4)
    assert close.mean() > 0.995, f"{(~close).sum()} of {close.size} differ"  # a flipped rounding: 2^-8
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)


def expected_for_rstd_within_2_ulp(x, w, norm, residual, swiglu, got):
    """expected(bf16=True) with each row's h = (x rstd) g formed in float32 from an rstd up to 2 ulp off
    the float32 one (rsqrtf's bound), the offset that agrees most with `got` chosen per row: one ulp moves
    a whole row's h, and with it the bf16 rounding of a few of its elements, so a row can differ from the
    float64 reference in up to a quarter of its outputs (by ~2^-8 of a term) while the kernel is right."""
    x32, norm32 = x.astype(np.float32), norm.astype(np.float32)
    rstd = (1.0 / np.sqrt((x32 * x32).mean(axis=1) + np.float32(EPS))).astype(np.float32)
    candidates = []
    for ulps in range(-2, 3):
        h = (x32 * (rstd.view(np.int32) + ulps).view(np.float32)[:, None]) * norm32  # (R, K)
        candidates.append(expected(h, w, None, residual, swiglu, bf16=True))
    candidates = np.stack(candidates)  # (5, R, columns)
    agree = np.isclose(candidates, got[None], rtol=1e-4, atol=1e-4).mean(axis=2)  # (5, R)
    return candidates[agree.argmax(axis=0), np.arange(x.shape[0])]


@pytest.mark.gpu
# 13, 40: groups of 8 rows (float32) with the last one partial; 32, 33, 70: launches of 32 (bf16)
@pytest.mark.parametrize("rows", [2, 4, 8, 13, 32, 33, 70])
@pytest.mark.parametrize(("use_norm", "use_residual", "swiglu"), FUSIONS)
@pytest.mark.parametrize("bf16", [False, True])
def test_each_of_several_rows_is_the_one_row_result_bit_for_bit(rows, use_norm, use_residual, swiglu, bf16):
    """A speculative step's rows (staged) and a plain step's row (each warp on its own) give the same bits,
    so speculative decoding emits plain greedy's tokens: the norm and the products sum in the same order."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(rows + 31)
    x, w, norm, residual = _gpu(cp, *inputs(rng, rows, 768, 1280, swiglu, np.float32))
    w = cast.to_bf16(w) if bf16 else w
    norm, residual = (norm if use_norm else None), (residual if use_residual else None)
    assert_rows_are_the_one_row_results(x, w, norm, residual, swiglu)


LONG_OR_RAGGED = [(40, 2048, 768, False), (40, 2048, 1536, True), (37, 4096, 64, False), (33, 800, 74, False)]
LONG_OR_RAGGED += [(33, 800, 74, True)]


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "k", "n", "swiglu"), LONG_OR_RAGGED)
def test_bf16_rows_of_long_or_ragged_products_are_the_one_row_results(rows, k, n, swiglu) -> None:
    """The tensor-core kernel's row invariance where warps sum different numbers of chunks (K 800), where
    launches hold 16 rows (K 4096) and where the last tile of 16 columns is partly used (37 columns)."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(rows + k)
    x, w, norm, residual = _gpu(cp, *inputs(rng, rows, k, n, swiglu, np.float32))
    assert_rows_are_the_one_row_results(x, cast.to_bf16(w), norm, residual, swiglu)


@pytest.mark.gpu
def test_the_rule_picks_the_tensor_cores_for_bf16_weights_whose_k_they_take() -> None:
    """bf16 weights with K a multiple of 32 (at most 4096, 2048 with swiglu) run on the tensor cores;
    float32 weights and other bf16 K on the CUDA cores; either way the kernels take them."""
    cp = pytest.importorskip("cupy")
    for k, swiglu, dtype, mma in [
        (768, False, np.uint16, True),
        (4096, False, np.uint16, True),
        (4096, True, np.uint16, False),  # 16 chunks a warp for gate and up rows: the CUDA-core kernel
        (2048, True, np.uint16, True),
        (200, False, np.uint16, False),  # K not a multiple of 32
        (768, False, np.float32, False),
    ]:
        x, w = cp.ones((4, k), dtype=cp.float32), cp.zeros((64, k), dtype=dtype)
        assert decode_linear_cuda._uses_mma(w, swiglu) is mma, (k, swiglu, dtype)
        assert decode_linear_cuda.decode_linear_fits(x, w, swiglu=swiglu), (k, swiglu, dtype)


@pytest.mark.gpu
def test_more_rows_or_a_misaligned_weight_take_the_unfused_path() -> None:
    """129 rows (more than 16 launches of 8), a weight whose rows are not whole 16-byte pieces (K = 201
    float32), a misaligned x, or rows whose staged h would not fit beside the kernel's static shared memory
    (8 x 2048 float32: 64 KB; 8 x 1536: 48 KB, the whole default) go to the unfused ops, which give the same
    result; and the kernel agrees with the same op on float64 CuPy arrays (the NumPy-style code on the
    GPU)."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    for rows, k in [(129, 256), (2, 201), (2, 260), (8, 2048), (8, 1536)]:
        x, w, norm, residual = inputs(rng, rows, k, 64, True, np.float32)
        gx, gw, gnorm = _gpu(cp, x, w, norm)
        if k == 260:  # x from an address 8 bytes past a 16-byte boundary
            gx = cp.empty(gx.size + 2, dtype=cp.float32)[2:].reshape(gx.shape)
            gx[...] = cp.asarray(x)
        assert not decode_linear_cuda.decode_linear_fits(gx, gw, gnorm)
        got = ek.decode_linear_forward(gx, gw, norm=gnorm, eps=EPS, swiglu=True)
        np.testing.assert_allclose(cp.asnumpy(got), expected(x, w, norm, swiglu=True), rtol=1e-4, atol=1e-4)
    x, w, norm, residual = inputs(rng, 2, 256, 64, False, np.float32)
    gx, gw, gnorm, gres = _gpu(cp, x, w, norm, residual)
    assert decode_linear_cuda.decode_linear_fits(gx, gw, gnorm)
    fused = ek.decode_linear_forward(gx, gw, norm=gnorm, eps=EPS, residual=gres)
    gx64, gw64, gnorm64, gres64 = (a.astype(cp.float64) for a in (gx, gw, gnorm, gres))
    unfused = ek.decode_linear_forward(gx64, gw64, norm=gnorm64, eps=EPS, residual=gres64)
    assert fused.dtype == cp.float32 and unfused.dtype == cp.float64
    np.testing.assert_allclose(cp.asnumpy(fused), cp.asnumpy(unfused), rtol=1e-4, atol=1e-4)
