"""bf16 products through cuBLASLt (matmul/cublaslt.py) and the timed choice between it and cublasGemmEx
(matmul/gemm_tuned.py): every heuristic candidate is the float32 product of the bf16 operands (all four
transposes, bf16 and float32 outputs, added into an output), a kind is timed once, a kind first seen in a
CUDA graph capture runs cublasGemmEx there and is timed after, tuning turned off (tuned=False, a Precision
with gemm_tuning False) times nothing."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.testing import bf16_bits, bf16_values, relative_error
from tests.conftest import cupy_with_a_device

pytestmark = pytest.mark.gpu
cp = cupy_with_a_device()

from euler_kernels.cuda import cast  # noqa: E402
from euler_kernels.matmul import (  # noqa: E402
    cublaslt,
    gemm,
    gemm_tuned,
)


def operands(rng, m, n, k, trans_a, trans_b):
    """bf16 a and b on the GPU as gemm_bf16 takes them, and the float64 product of their values."""
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    a16, b16 = bf16_bits(a), bf16_bits(b)
    va, vb = bf16_values(a16).astype(np.float64), bf16_values(b16).astype(np.float64)
    return cp.asarray(a16), cp.asarray(b16), (va.T if trans_a else va) @ (vb.T if trans_b else vb)


@pytest.fixture
def fresh_choices(monkeypatch):
    """No kind timed yet (this test's choices are its own)."""
    monkeypatch.setattr(gemm_tuned, "_choices", {})
    monkeypatch.setattr(gemm_tuned, "_products", {})


@pytest.mark.parametrize(("m", "n", "k"), [(512, 256, 768), (96, 80, 48), (1024, 2048, 128)])
@pytest.mark.parametrize("trans", [(False, False), (False, True), (True, False), (True, True)])
def test_every_cublaslt_candidate_is_the_float32_product_of_the_bf16_operands(m, n, k, trans):
    rng = np.random.default_rng(m + n + k + 2 * trans[0] + trans[1])
    a, b, want = operands(rng, m, n, k, *trans)
    start = rng.standard_normal((m, n)).astype(np.float32)
    for out_type, bound in ((gemm.CUDA_R_32F, 1e-5), (gemm.CUDA_R_16BF, 4e-3)):
        mask = cublaslt.REDUCTION_IN_FLOAT32 if out_type == gemm.CUDA_R_16BF else None
        types = (gemm.CUDA_R_16BF, gemm.CUDA_R_16BF, out_type)
        product = cublaslt.Product(m, n, k, trans, types, 256, gemm_tuned.TUNE_CANDIDATES, mask)
        assert product.count > 0
        for i in range(product.count):
            out = cp.empty((m, n), cp.float32 if out_type == gemm.CUDA_R_32F else cp.uint16)
            assert product.run(i, a, b, out, False) == 0, i
            got = out if out.dtype == cp.float32 else cast.from_bf16(out)
            assert relative_error(got.get(), want) < bound, (i, out_type)
        if out_type == gemm.CUDA_R_32F:  # added into an output: out += product
            for i in range(product.count):
                out = cp.asarray(start)
                assert product.run(i, a, b, out, True) == 0, i
                assert relative_error(out.get(), start + want) < 1e-5, i


@pytest.mark.parametrize("margin", [-10.0, 10.0], ids=["cublaslt-always", "gemm-ex-always"])
def test_a_kind_is_timed_once_and_runs_its_choice(monkeypatch, fresh_choices, margin):
    """margin -10: any cuBLASLt candidate beats cublasGemmEx, 10: none does; either way the product is right,
    in place too, and the kind is timed once."""
    monkeypatch.setattr(gemm_tuned, "TUNE_MARGIN", margin)
    rng = np.random.default_rng(3)
    a, b, want = operands(rng, 2048, 256, 768, False, True)  # a k or v projection's shape
    got = gemm.gemm_bf16(a, b, trans_b=True)
    assert relative_error(got.get(), want) < 1e-5
    ((_, choice),) = gemm_tuned.choices().items()
    assert (choice >= 0) if margin < 0 else (choice == gemm_tuned.GEMM_EX)
    start = rng.standard_normal(want.shape).astype(np.float32)
    added = gemm.gemm_bf16(a, b, trans_b=True, out=cp.asarray(start))
    assert relative_error(added.get(), start + want) < 1e-5
    rounded = gemm.gemm_bf16(a, b, trans_b=True, bf16_out=True)  # another kind: its output type
    assert relative_error(cast.from_bf16(rounded).get(), want) < 4e-3
    assert len(gemm_tuned.choices()) == 2


def test_a_kind_first_seen_in_a_capture_runs_gemm_ex_there_and_is_timed_after(monkeypatch, fresh_choices):
    monkeypatch.setattr(gemm_tuned, "TUNE_MARGIN", -10.0)  # once timed: cuBLASLt
    rng = np.random.default_rng(4)
    a, b, want = operands(rng, 1024, 256, 512, True, False)
    gemm.gemm_bf16(a[:, :16].copy(), b, trans_a=True)  # handles made outside the capture (another kind)
    timed = len(gemm_tuned.choices())
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        out = gemm.gemm_bf16(a, b, trans_a=True)
        graph = stream.end_capture()
        assert len(gemm_tuned.choices()) == timed  # not timed during the capture
        out.fill(0)
        graph.launch(stream)
    stream.synchronize()
    assert relative_error(out.get(), want) < 1e-5
    again = gemm.gemm_bf16(a, b, trans_a=True)
    assert len(gemm_tuned.choices()) == timed + 1
    assert relative_error(again.get(), want) < 1e-5


def test_tuning_off_times_nothing(fresh_choices):
    a, b, want = operands(np.random.default_rng(5), 256, 128, 64, False, False)
    assert relative_error(gemm.gemm_bf16(a, b, tuned=False).get(), want) < 1e-5
    assert gemm_tuned.choices() == {}


def test_a_precision_without_tuning_times_none_of_a_linear_ops_products(fresh_choices):
    """Precision(gemm_tuning=False) reaches every bf16 product of the linear op: forward, dx and dweight."""
    rng = np.random.default_rng(6)
    x = cp.asarray(rng.standard_normal((256, 64)).astype(np.float32))
    w = cp.asarray(rng.standard_normal((128, 64)).astype(np.float32))
    out, cache = ek.linear_forward(x, w, precision=ek.Precision("bf16", gemm_tuning=False))
    dx, dw = ek.linear_backward(cp.ones_like(out), cache)
    assert out.dtype == dx.dtype == dw.dtype == cp.float32
    assert gemm_tuned.choices() == {}
