"""Cross-entropy over bf16 logits (the bf16 head's product, as autocast's): the kernels widen each logit
to float32, so the loss and dlogits are those of the float32 values the bf16 bits stand for, against a
float64 reference; the backward may write dlogits over the logits."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.testing import bf16_bits, bf16_values

pytestmark = pytest.mark.gpu
cp = pytest.importorskip("cupy")


def _reference(z: np.ndarray, targets: np.ndarray, w: np.ndarray, dloss: float) -> tuple[float, np.ndarray]:
    """float64 loss and dlogits of logits z (N, V), targets (N,), weights w (N,)."""
    z = z.astype(np.float64)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    denom = max(w.sum(), 1.0)
    loss = float((w * (lse - z[np.arange(len(z)), targets])).sum() / denom)
    d = np.exp(z - lse[:, None])
    d[np.arange(len(z)), targets] -= 1.0
    return loss, d * (w * dloss / denom)[:, None]


@pytest.mark.parametrize("vocab", [4096, 1001], ids=["float4-rows", "odd-V"])
@pytest.mark.parametrize("in_place", [False, True])
def test_bf16_logits_give_the_loss_and_gradient_of_their_values(vocab: int, in_place: bool) -> None:
    rng = np.random.default_rng(vocab)
    n = 64
    bits = bf16_bits((3.0 * rng.standard_normal((n, vocab))).astype(np.float32))
    targets = rng.integers(0, vocab, n)
    targets[5] = -100  # ignored
    mask = (rng.random(n) < 0.8).astype(np.float32)
    w = mask * (targets != -100)
    want_loss, want_d = _reference(bf16_values(bits), np.where(targets == -100, 0, targets), w, 0.5)
    logits = cp.asarray(bits)
    loss, cache = ek.cross_entropy_forward(logits, cp.asarray(targets), cp.asarray(mask))
    assert loss.dtype == cp.float32
    assert abs(float(loss) - want_loss) <= 1e-5 * abs(want_loss)
    d = ek.cross_entropy_backward(0.5, cache, bf16_out=True, in_place=in_place)
    assert d.dtype == cp.uint16 and d.shape == (n, vocab)
    if in_place and vocab % 4 == 0:
        assert d.data.ptr == logits.data.ptr  # written over the logits
    got = bf16_values(d).astype(np.float64)
    # each value rounded to bf16 once (2^-8 relative), after float32 exp
    assert np.all(np.abs(got - want_d) <= 2.0**-8 * np.abs(want_d) + 1e-7 * np.abs(want_d).max())


def test_in_place_needs_bf16_logits() -> None:
    logits = cp.zeros((2, 8), cp.float32)
    _, cache = ek.cross_entropy_forward(logits, cp.asarray([1, 2]))
    with pytest.raises(ValueError, match="in_place needs bf16 logits"):
        ek.cross_entropy_backward(1.0, cache, in_place=True)
