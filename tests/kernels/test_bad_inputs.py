"""Bad input raises a ValueError that names the op and the offending shapes or dtypes."""

# ruff: noqa: E501  (the table of cases reads best one case per line)

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.optim.adamw import adamw_update
from euler_kernels.optim.grad_norm import clip_grad_norm
from euler_kernels.residual.residual import residual_forward
from euler_kernels.rmsnorm.rmsnorm import rmsnorm_backward_bf16_copy

f32, f64 = np.float32, np.float64


def z(*shape, dtype=f64):
    return np.zeros(shape, dtype=dtype)


CASES = {
    "embedding vocab range": (lambda: ek.embedding_forward(z(4, 3), np.array([[4]])), r"embedding_forward.*\[0, 4\)"),
    "embedding float tokens": (lambda: ek.embedding_forward(z(4, 3), z(1, 2)), r"embedding_forward.*integers"),
    "embedding dweight shape": (lambda: ek.embedding_backward(z(1, 2, 4), ek.embedding_forward(z(4, 3), np.zeros((1, 2), int))[1]),
                                r"embedding_backward.*dout\(1, 2, 4\)"),
    "rmsnorm weight": (lambda: ek.rmsnorm_forward(z(2, 5), z(4)), r"rmsnorm_forward.*x\(2, 5\).*weight\(4,\)"),
    "rmsnorm dtype": (lambda: ek.rmsnorm_forward(z(2, 4, dtype=f32), z(4)), r"rmsnorm_forward.*float32.*float64"),
    "rmsnorm dout": (lambda: ek.rmsnorm_backward(z(2, 3), ek.rmsnorm_forward(z(2, 4), z(4))[1]), r"rmsnorm_backward.*dout\(2, 3\)"),
    "rmsnorm bf16 copy on NumPy": (lambda: rmsnorm_backward_bf16_copy(z(2, 4), ek.rmsnorm_forward(z(2, 4), z(4))[1]),
                                   r"rmsnorm_backward_bf16_copy.*GPU"),
    "linear shapes": (lambda: ek.linear_forward(z(2, 5), z(3, 4)), r"linear_forward.*x\(2, 5\).*weight\(3, 4\)"),
    "linear int": (lambda: ek.linear_forward(np.zeros((2, 4), int), z(3, 4)), r"linear_forward.*int64"),
    "linear dout": (lambda: ek.linear_backward(z(2, 4), ek.linear_forward(z(2, 4), z(3, 4))[1]), r"linear_backward.*dout\(2, 4\)"),
    "rope odd dim": (lambda: ek.rope_tables(5, 10), r"rope_tables.*even.*5"),
    "rope table length": (lambda: ek.rope_forward(z(1, 4, 2, 6), *ek.rope_tables(6, 5, dtype=f64), offset=2),
                          r"rope_forward.*exceed.*x\(1, 4, 2, 6\).*cos\(5, 3\)"),
    "rope table width": (lambda: ek.rope_forward(z(1, 4, 2, 8), *ek.rope_tables(6, 5, dtype=f64)), r"rope_forward.*cos\(5, 3\)"),
    "qkv weight rows": (lambda: ek.qkv_forward(z(6, 4), z(30, 4), 4, 2, (2, 3), *ek.rope_tables(4, 3, dtype=f64)),
                        r"qkv_forward.*Hq \+ 2 Hkv = 8.*x\(6, 4\).*weight\(30, 4\)"),
    "qkv tokens": (lambda: ek.qkv_forward(z(5, 4), z(32, 4), 4, 2, (2, 3), *ek.rope_tables(4, 3, dtype=f64)), r"qkv_forward.*\(6, C\).*x\(5, 4\)"),
    "qkv heads": (lambda: ek.qkv_forward(z(6, 4), z(28, 4), 3, 2, (2, 3), *ek.rope_tables(4, 3, dtype=f64)), r"qkv_forward: n_heads \(3\).*n_kv_heads \(2\)"),
    "qkv dout": (lambda: ek.qkv_backward((z(2, 3, 4, 4), z(2, 3, 2, 4), z(2, 3, 1, 4)),
                                         ek.qkv_forward(z(6, 4), z(32, 4), 4, 2, (2, 3), *ek.rope_tables(4, 3, dtype=f64))[1]),
                 r"qkv_backward.*dv\(2, 3, 1, 4\)"),
    "attention heads": (lambda: ek.attention_forward(z(1, 3, 3, 4), z(1, 3, 2, 4), z(1, 3, 2, 4)),
                        r"attention_forward.*multiple.*q\(1, 3, 3, 4\).*k\(1, 3, 2, 4\)"),
    "attention T > S": (lambda: ek.attention_forward(z(1, 4, 2, 4), z(1, 3, 2, 4), z(1, 3, 2, 4)), r"attention_forward.*T <= S"),
    "attention k != v": (lambda: ek.attention_forward(z(1, 3, 2, 4), z(1, 3, 2, 4), z(1, 3, 2, 2)), r"attention_forward.*v\(1, 3, 2, 2\)"),
    "attention dtype": (lambda: ek.attention_forward(z(1, 3, 2, 4), z(1, 3, 2, 4, dtype=f32), z(1, 3, 2, 4)),
                        r"attention_forward.*k: float32"),
    "attention dout": (lambda: ek.attention_backward(z(1, 3, 2, 2), ek.attention_forward(z(1, 3, 2, 4), z(1, 3, 2, 4), z(1, 3, 2, 4))[1]),
                       r"attention_backward.*dout\(1, 3, 2, 2\)"),
    "swiglu shapes": (lambda: ek.swiglu_forward(z(2, 3), z(3, 2)), r"swiglu_forward.*gate\(2, 3\).*up\(3, 2\)"),
    "residual shapes": (lambda: residual_forward(z(2, 3), z(2, 4)), r"residual_forward.*x\(2, 3\).*branch\(2, 4\)"),
    "residual dtype": (lambda: residual_forward(z(2, 3), z(2, 3, dtype=f32)), r"residual_forward.*branch: float32"),
    "residual norm shapes": (lambda: ek.residual_rmsnorm_forward(z(2, 3), z(2, 4), z(3)),
                             r"residual_rmsnorm_forward.*x\(2, 3\).*branch\(2, 4\)"),
    "residual norm weight": (lambda: ek.residual_rmsnorm_forward(z(2, 3), z(2, 3), z(4)),
                             r"residual_rmsnorm_forward.*weight\(4,\)"),
    "ce targets shape": (lambda: ek.cross_entropy_forward(z(2, 5), np.zeros(3, int)), r"cross_entropy_forward.*logits\(2, 5\).*targets\(3,\)"),
    "ce target range": (lambda: ek.cross_entropy_forward(z(2, 5), np.array([0, 5])), r"cross_entropy_forward.*\[0, 5\)"),
    "ce mask shape": (lambda: ek.cross_entropy_forward(z(2, 5), np.zeros(2, int), z(3)), r"cross_entropy_forward.*loss_mask\(3,\)"),
    "adamw shapes": (lambda: adamw_update(z(3), z(3), z(2), z(3), 1, 0.1), r"adamw_update.*v\(2,\)"),
    "adamw dtype": (lambda: adamw_update(z(3), z(3, dtype=f32), z(3), z(3), 1, 0.1), r"adamw_update.*m: float32"),
    "adamw step": (lambda: adamw_update(z(3), z(3), z(3), z(3), 0, 0.1), r"adamw_update.*step"),
    "clip max_norm": (lambda: clip_grad_norm([z(3)], 0.0), r"clip_grad_norm.*max_norm"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_raises_named_value_error(case: str) -> None:
    call, pattern = CASES[case]
    with pytest.raises(ValueError, match=pattern):
        call()
