"""Newton-Schulz and Muon: the iteration against a float64 scalar-polynomial reference and its known
singular-value band, one Muon update against torch.optim.Muon, the control vector's skip and clip."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.optim.newton_schulz import NS_COEFFICIENTS, newton_schulz


def scalar_iteration(s: np.ndarray, steps: int = 5) -> np.ndarray:
    """What the iteration does to each singular value: X = U p(S) V^T for an odd polynomial p."""
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        s = a * s + b * s**3 + c * s**5
    return s


def svd_factors(rng, shape, k):
    u, _ = np.linalg.qr(rng.standard_normal((shape[0], shape[0])))
    v, _ = np.linalg.qr(rng.standard_normal((shape[1], shape[1])))
    return u[:, :k], v[:, :k]


def svd_matrix(rng, shape, singular_values) -> np.ndarray:
    u, v = svd_factors(rng, shape, len(singular_values))
    return u @ np.diag(singular_values) @ v.T


@pytest.mark.parametrize("shape", [(48, 48), (64, 24), (24, 64)], ids=["square", "tall", "wide"])
@pytest.mark.parametrize("cond", [1.0, 1e2, 1e4], ids=["flat", "cond1e2", "cond1e4"])
def test_newton_schulz_is_the_scalar_polynomial_on_each_singular_value(shape, cond) -> None:
    """G = U S V^T gives X = U p(S / ||G||_F) V^T exactly (an odd matrix polynomial keeps U and V)."""
    rng = np.random.default_rng(0)
    s = np.logspace(0, -np.log10(cond), min(shape))
    u, v = svd_factors(rng, shape, len(s))
    x = newton_schulz(u @ np.diag(s) @ v.T)  # float64
    want = u @ np.diag(scalar_iteration(s / np.linalg.norm(s))) @ v.T
    assert np.linalg.norm(x - want) < 1e-10 * np.linalg.norm(want)


def test_singular_values_land_in_the_band_the_iteration_produces() -> None:
    """Random rectangular matrices and spectra down to 1e-2 of the largest: every singular value in
    about [0.68, 1.21] (the iteration approximates U V^T, not exactly); float32 agrees with float64."""
    rng = np.random.default_rng(1)
    cases = [rng.standard_normal((96, 32)), rng.standard_normal((32, 96))]
    cases += [svd_matrix(rng, (64, 40), np.logspace(0, -2, 40))]
    for g in cases:
        x64 = newton_schulz(g)
        s = np.linalg.svd(x64, compute_uv=False)
        assert 0.6 < s.min() and s.max() < 1.25, (s.min(), s.max())
        x32 = newton_schulz(g.astype(np.float32))
        assert x32.dtype == np.float32
        assert np.linalg.norm(x32 - x64) < 1e-5 * np.linalg.norm(x64)


def test_newton_schulz_of_a_stack_is_each_matrix_s_own() -> None:
    """(n, r, c) stacks, tall and wide: every matrix is orthogonalised on its own (its own norm)."""
    rng = np.random.default_rng(3)
    for shape in [(3, 40, 16), (2, 16, 40)]:
        stack = rng.standard_normal(shape) * np.array([1.0, 1e-3, 50.0][: shape[0]])[:, None, None]
        got = newton_schulz(stack)
        assert got.shape == shape
        for g, x in zip(stack, got):
            assert np.linalg.norm(x - newton_schulz(g)) < 1e-12 * np.linalg.norm(x)


def torch_and_ours_after_two_steps(monkeypatch, torch_in_float64: bool):
    """Tall, wide and square matrices after two steps (momentum matters in the second) of ours and of
    torch.optim.Muon; torch orthogonalises in bf16 unless its bf16 cast is made a no-op."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs PyTorch >= 2.9")
    if torch_in_float64:
        monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self: self.clone())
    rng = np.random.default_rng(2)
    shapes = [(40, 16), (16, 40), (24, 24)]
    p0 = [rng.standard_normal(s) * 0.1 for s in shapes]
    ours, bufs = [p.copy() for p in p0], [np.zeros(s) for s in shapes]
    theirs = [torch.tensor(p, requires_grad=True) for p in p0]
    opt = torch.optim.Muon(theirs, lr=0.02, weight_decay=0.1, momentum=0.95, nesterov=True)
    control = np.array([1.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=np.float32)
    hyper = np.array([0.02], dtype=np.float32)
    for _ in range(2):
        grads = [rng.standard_normal(s) for s in shapes]
        ek.muon_update(ours, bufs, grads, control, hyper, lr_slot=0, momentum=0.95, weight_decay=0.1)
        for t, g in zip(theirs, grads):
            t.grad = torch.tensor(g)
        opt.step()
    return [(got - start, want.detach().numpy() - start) for got, want, start in zip(ours, theirs, p0)]


def test_muon_updates_equal_torch_optim_muon_in_float64(monkeypatch) -> None:
    """The same algorithm: momentum, Nesterov, Newton-Schulz, lr scaled by shape, decoupled decay (lr as
    float32, as the device holds it: ~1e-8)."""
    for moved, want in torch_and_ours_after_two_steps(monkeypatch, torch_in_float64=True):
        assert np.linalg.norm(moved - want) < 1e-7 * np.linalg.norm(want)


def test_muon_updates_equal_torch_optim_muon_to_bf16_accuracy(monkeypatch) -> None:
    for moved, want in torch_and_ours_after_two_steps(monkeypatch, torch_in_float64=False):
        assert np.linalg.norm(moved - want) < 2e-2 * np.linalg.norm(want)


def test_muon_reads_clip_and_skip_from_the_control_vector() -> None:
    rng = np.random.default_rng(3)
    p, g = rng.standard_normal((8, 6)), rng.standard_normal((8, 6))
    hyper = np.array([0.05], dtype=np.float32)
    skipped, buf = p.copy(), np.zeros_like(p)
    ek.muon_update([skipped], [buf], [g], np.array([1, 0, 0, 0, 0, 0], np.float32), hyper, 0)
    assert np.array_equal(skipped, p) and not buf.any()  # apply = 0: nothing changes, momentum neither
    half, full = p.copy(), p.copy()
    b_half, b_full = np.zeros_like(p), np.zeros_like(p)
    ek.muon_update([half], [b_half], [g], np.array([0.5, 1, 0, 0, 0, 0], np.float32), hyper, 0)
    ek.muon_update([full], [b_full], [0.5 * g], np.array([1, 1, 0, 0, 0, 0], np.float32), hyper, 0)
    np.testing.assert_allclose(half, full, rtol=1e-12)  # the clip factor scales the gradient
    np.testing.assert_allclose(b_half, b_full, rtol=1e-12)


def test_shapes_are_checked() -> None:
    z = np.zeros((3, 2))
    with pytest.raises(ValueError, match="muon_update: needs matrices"):
        ek.muon_update([z], [np.zeros(3)], [z], np.ones(6, np.float32), np.ones(1, np.float32), 0)
    with pytest.raises(ValueError, match="newton_schulz: needs a 2-D matrix"):
        newton_schulz(np.zeros(3))
