"""Float64 central-difference gradient checking for forward/backward pairs and whole models.

For an input x with analytic gradient a and numerical gradient n, each checked element i gets

    h_i   = (x_i + eps) - x_i                                    eps, rounded to what x_i can represent
    n_i   = (f(x + h_i e_i) - f(x - h_i e_i)) / (2 h_i)          central difference in float64
    res_i = 8 * 2**-52 * max(|f(x + h_i e_i)| + |f(x - h_i e_i)|, 1) / (2 h_i)
                                                                 rounding resolution of n_i
    raw_i = |a_i - n_i| / max(|a_i|, |n_i|, floor)               relative error, shown in the table
    err_i = max(0, |a_i - n_i| - res_i) / max(|a_i|, |n_i|, floor)
                                                                 the part beyond rounding noise, judged
    floor = max(1e-3 * max_j |n_j|, atol)                        elements under 0.1% of the tensor's
                                                                 largest gradient are judged at that scale

An input passes `ok(tol)` when max_i err_i <= tol; the table shows both max_i raw_i and max_i err_i.

For an op, f = sum(out * R) with a fixed random R (so dout = R). The difference is taken as
sum((out(x + h e_i) - out(x - h e_i)) * R), so that outputs a perturbation does not touch cancel exactly,
and |f+| + |f-| in res_i is sum((|out+| + |out-|) * |R|) over the outputs that the perturbation changed
(the only terms whose rounding can reach the difference), or over all outputs if none changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from euler_kernels.backend import get_array_module, to_numpy


@dataclass
class InputReport:
    """Result for one checked input: the worst relative errors and where the judged one happened."""

    name: str
    shape: tuple[int, ...]
    checked: int
    max_rel_error: float  # max raw_i (see the module docstring)
    max_excess_error: float  # max err_i: relative error beyond the rounding resolution; judged by ok()
    worst_index: tuple[int, ...]
    analytic: float
    numeric: float


@dataclass
class GradcheckReport:
    """Per-input results of `gradcheck` / `gradcheck_scalar`."""

    inputs: list[InputReport] = field(default_factory=list)
    label: str = ""

    def max_error(self) -> float:
        """The largest judged error (err_i) over all inputs."""
        return max((r.max_excess_error for r in self.inputs), default=0.0)

    def ok(self, tol: float = 1e-6) -> bool:
        """True when every input's judged error (beyond rounding noise) is at most `tol`."""
        return all(r.max_excess_error <= tol for r in self.inputs)

    def table(self, tol: float = 1e-6) -> str:
        """A printable table: op, input, shape, elements checked, max relative error, beyond noise, OK."""
        cols = f"{'checked':>7} {'max rel err':>11} {'beyond noise':>12}  ok"
        head = f"{'op':<22} {'input':<8} {'shape':<16} {cols}"
        lines = [head, "-" * len(head)]
        for r in self.inputs:
            ok = "OK" if r.max_excess_error <= tol else "FAIL"
            lines.append(
                f"{self.label:<22} {r.name:<8} {r.shape!s:<16} {r.checked:>7} {r.max_rel_error:>11.2e} "
                f"{r.max_excess_error:>12.2e}  {ok}"
            )
        return "\n".join(lines)

    __str__ = table

    def raise_if_bad(self, tol: float = 1e-6) -> None:
        """Raise AssertionError naming the first input (and element) whose error exceeds `tol`."""
        for r in self.inputs:
            if r.max_excess_error > tol:
                raise AssertionError(
                    f"gradcheck {self.label}: input {r.name!r} {r.shape} has relative error "
                    f"{r.max_excess_error:.3e} > {tol:.1e} (beyond rounding noise) "
                    f"at element {r.worst_index}: "
                    f"analytic {r.analytic:.10g} vs numeric {r.numeric:.10g}\n{self.table(tol)}"
                )


def judged(tol: float) -> str:
    """What a table's OK means, for the line under it.

    >>> judged(1e-6)
    "each 'beyond noise' error <= 1e-06 ('max rel err' adds the differences' rounding noise)"
    """
    return f"each 'beyond noise' error <= {tol:g} ('max rel err' adds the differences' rounding noise)"


def _sample(size: int, max_samples: int | None, rng: np.random.Generator) -> np.ndarray:
    if max_samples is None or size <= max_samples:
        return np.arange(size)
    return np.sort(rng.choice(size, size=max_samples, replace=False))


def _check_one(name, x, analytic, objective, eps, max_samples, atol, rng) -> InputReport:
    """Perturb elements of x (float64, modified and restored in place) and compare with `analytic`."""
    a_flat = to_numpy(analytic).astype(np.float64).reshape(-1)
    flat = x.reshape(-1)  # a view: x is contiguous, we own it
    idx = _sample(flat.size, max_samples, rng)
    numeric = np.empty(idx.size)
    resolution = np.empty(idx.size)
    for j, i in enumerate(idx):
        orig = float(flat[i])
        h = (orig + eps) - orig  # the step actually representable at orig (exact, unlike eps itself)
        flat[i] = orig + h
        f_plus = objective()
        flat[i] = orig - h
        f_minus = objective()
        flat[i] = orig
        diff, size = _difference(f_plus, f_minus)
        numeric[j] = diff / (2.0 * h)
        # at least an O(1) size: ops round their O(1) intermediates (e.g. log(1 + tiny)) even when f is tiny
        resolution[j] = 8 * np.finfo(np.float64).eps * max(size, 1.0) / (2.0 * h)
    a = a_flat[idx]
    floor = max(1e-3 * float(np.max(np.abs(numeric), initial=0.0)), atol)
    scale = np.maximum(np.maximum(np.abs(a), np.abs(numeric)), floor)
    raw = np.abs(a - numeric) / scale
    err = np.maximum(np.abs(a - numeric) - resolution, 0.0) / scale  # disagreement beyond rounding noise
    if not err.size:
        return InputReport(name, tuple(x.shape), 0, 0.0, 0.0, (), 0.0, 0.0)
    w = int(np.argmax(err)) if err.max() > 0 else int(np.argmax(raw))
    worst = tuple(int(c) for c in np.unravel_index(idx[w], x.shape))
    return InputReport(
        name,
        tuple(x.shape),
        int(idx.size),
        float(raw.max()),
        float(err.max()),
        worst,
        float(a[w]),
        float(numeric[w]),
    )


def _difference(plus: Any, minus: Any) -> tuple[float, float]:
    """(f(x+h) - f(x-h), |f(x+h)| + |f(x-h)|) for floats; for an op's pairs (out, R) with
    f = sum(out * R) the size is sum((|out+| + |out-|) * |R|) over the outputs that changed."""
    if isinstance(plus, tuple):
        xp = get_array_module(plus[0])
        (op, r), om = plus, minus[0]
        touched = op != om  # outputs the perturbation did not change cancel exactly
        if not bool(touched.any()):  # the change vanished below rounding: every output could hide it
            touched = xp.ones_like(touched)
        size = xp.sum(xp.where(touched, xp.abs(op) + xp.abs(om), 0.0) * xp.abs(r))
        return float(xp.sum((op - om) * r)), float(size)
    return plus - minus, abs(plus) + abs(minus)


def _is_float_array(v: Any) -> bool:
    return hasattr(v, "dtype") and hasattr(v, "shape") and np.dtype(v.dtype).kind == "f"


def _match_grads(grads: Any, wrt: Sequence[str], floats: Sequence[str]) -> dict[str, Any]:
    """Map backward's result (array, tuple or dict) to input names."""
    if isinstance(grads, Mapping):
        return dict(grads)
    if not isinstance(grads, tuple | list):
        grads = (grads,)
    for names in (wrt, floats):
        if len(grads) == len(names):
            return dict(zip(names, grads))
    raise ValueError(
        f"gradcheck: backward returned {len(grads)} gradient(s), expected {len(wrt)} "
        f"(for {list(wrt)}) or {len(floats)} (for {list(floats)})"
    )


def gradcheck(
    forward: Callable[..., tuple[Any, Any]],
    backward: Callable[[Any, Any], Any],
    inputs: Mapping[str, Any],
    wrt: Sequence[str] | None = None,
    eps: float = 1e-6,
    max_samples: int | None = 512,
    atol: float = 1e-6,
    seed: int = 0,
    label: str | None = None,
) -> GradcheckReport:
    """Check an op's analytic backward against float64 central differences.

    `forward(**inputs) -> (out, cache)`, `backward(dout, cache) -> grads` (a tuple in `wrt` order, or
    in the order of the float inputs, or a dict by name). Float inputs are copied to float64; other
    inputs (integer tokens, flags, sizes) are passed unchanged. Inputs larger than `max_samples`
    elements are checked on a random sample of that many elements. See the module docstring for the
    relative-error formula.

    >>> import numpy as np
    >>> from euler_kernels import linear_forward, linear_backward
    >>> rep = gradcheck(linear_forward, linear_backward, {"x": np.ones((2, 3)), "weight": np.ones((4, 3))})
    >>> rep.ok(1e-6)
    True
    """
    rng = np.random.default_rng(seed)
    xs = {k: (_float64_copy(v) if _is_float_array(v) else v) for k, v in inputs.items()}
    floats = [k for k, v in xs.items() if _is_float_array(v)]
    wrt = list(wrt) if wrt is not None else floats
    out, cache = forward(**xs)
    xp = get_array_module(out)
    r = xp.asarray(rng.standard_normal(np.shape(out)))  # dout, fixed for every evaluation
    grads = _match_grads(backward(r.copy(), cache), wrt, floats)

    def objective() -> tuple[Any, Any]:
        return forward(**xs)[0], r

    report = GradcheckReport(label=label or getattr(forward, "__name__", "op").removesuffix("_forward"))
    for name in wrt:
        if name not in grads or grads[name].shape != xs[name].shape:
            got = None if name not in grads else tuple(grads[name].shape)
            raise ValueError(f"gradcheck: gradient for {name!r} has shape {got}, input is {xs[name].shape}")
        report.inputs.append(_check_one(name, xs[name], grads[name], objective, eps, max_samples, atol, rng))
    return report


def _float64_copy(v: Any) -> Any:
    xp = get_array_module(v)
    return xp.array(v, dtype=xp.float64, order="C", copy=True)


def gradcheck_scalar(
    loss_fn: Callable[[dict[str, Any]], Any],
    params: Mapping[str, Any],
    grads: Mapping[str, Any],
    names: Sequence[str] | None = None,
    eps: float = 1e-6,
    max_samples: int | None = 64,
    atol: float = 1e-6,
    seed: int = 0,
    label: str = "loss",
) -> GradcheckReport:
    """Check analytic `grads` of a scalar `loss_fn(params)` by float64 central differences.

    `params` are copied to float64 and passed to `loss_fn` as a dict (perturbed one element at a time);
    `grads` holds the analytic gradient for each name in `names` (default: every key of `grads`).

    >>> import numpy as np
    >>> p = {"w": np.array([1.0, 2.0])}
    >>> gradcheck_scalar(lambda q: (q["w"] ** 2).sum(), p, {"w": 2 * p["w"]}).ok()
    True
    """
    rng = np.random.default_rng(seed)
    xs = {k: (_float64_copy(v) if _is_float_array(v) else v) for k, v in params.items()}
    report = GradcheckReport(label=label)
    for name in names if names is not None else list(grads):
        if name not in xs or tuple(grads[name].shape) != tuple(xs[name].shape):
            raise ValueError(f"gradcheck_scalar: gradient {name!r} does not match a parameter of that shape")
        report.inputs.append(
            _check_one(name, xs[name], grads[name], lambda: float(loss_fn(xs)), eps, max_samples, atol, rng)
        )
    return report
