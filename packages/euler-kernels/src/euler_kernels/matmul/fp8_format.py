"""FP8 operands: a tensor scaled by a power of two and rounded to e4m3 or e5m2, as the FP8 matrix products
take them (gemm_fp8.py); the GPU kernels are in fp8.cu, this module is their NumPy reference.

e4m3 (4 exponent bits, 3 mantissa bits, largest 448, no infinity) holds activations and weights; e5m2 (5 and
2, largest 57344) holds gradients, whose range is wider. A tensor x is stored as q = fp8(x * 2^k) with one
k per tensor: the largest k such that amax(|x|) * 2^k <= the format's largest value (so x * 2^k is exact
and only the rounding to fp8, nearest even, saturating, errs); x is q * 2^-k.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

# format: (exponent bits, mantissa bits, exponent bias, largest value = 0.875 * 2^max_exponent)
FORMATS = {"e4m3": (4, 3, 7, 9), "e5m2": (5, 2, 15, 16)}


def _format(fmt: str) -> tuple[int, int, int, int]:
    if fmt not in FORMATS:
        raise ValueError(f"fp8: format must be one of {sorted(FORMATS)}, got {fmt!r}")
    return FORMATS[fmt]


def largest(fmt: str) -> float:
    """The largest finite value of the format: 448 (e4m3) or 57344 (e5m2)."""
    return 0.875 * 2.0 ** _format(fmt)[3]


@functools.cache
def fp8_values(fmt: str) -> np.ndarray:
    """The value of each of the 256 bit patterns (float64; NaN patterns give NaN; e5m2 has +-inf).

    >>> fp8_values("e4m3")[[0x01, 0x38, 0x7e, 0xb8]].tolist()
    [0.001953125, 1.0, 448.0, -1.0]
    """
    e_bits, m_bits, bias, _ = _format(fmt)
    codes = np.arange(256)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent = (codes >> m_bits) & ((1 << e_bits) - 1)
    mantissa = (codes & ((1 << m_bits) - 1)) / 2.0**m_bits
    normal = (1 + mantissa) * 2.0 ** (exponent - bias)
    values = sign * np.where(exponent == 0, mantissa * 2.0 ** (1 - bias), normal)
    top = exponent == (1 << e_bits) - 1
    if fmt == "e4m3":  # only S.1111.111 is NaN; the rest of the top exponent is finite
        values[top & ((codes & 7) == 7)] = np.nan
    else:  # IEEE-like: the top exponent is inf (mantissa 0) or NaN
        values[top] = np.where((codes[top] & 3) == 0, sign[top] * np.inf, np.nan)
    return values


def round_to_fp8(x: Any, fmt: str) -> np.ndarray:
    """x (float32 or float64 values) rounded to the format: nearest, ties to even, values beyond the
    largest saturate to it (+-inf too), NaN stays NaN. Returns float64 values of the format.

    >>> round_to_fp8(np.array([1.0625, 1.1875, 500.0, -3e-3]), "e4m3").tolist()
    [1.0, 1.25, 448.0, -0.00390625]
    """
    _, m_bits, bias, _ = _format(fmt)
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    _, e = np.frexp(a)  # a = m 2^e with m in [0.5, 1): floor(log2 a) = e - 1
    quantum = np.ldexp(1.0, np.maximum(e - 1, 1 - bias) - m_bits)  # the format's spacing at a (or subnormal)
    with np.errstate(invalid="ignore"):
        q = np.minimum(np.rint(a / quantum) * quantum, largest(fmt))  # rint: ties to even
    return np.where(np.isnan(x), np.nan, np.copysign(q, x))


def scale_exponent(amax: float, fmt: str) -> int:
    """k of the scale 2^k for a tensor whose largest |value| is amax (float32): the largest k with
    amax * 2^k <= largest(fmt); 0 when amax is 0, inf or NaN; within [-126, 126].

    >>> scale_exponent(1.0, "e4m3"), scale_exponent(448.0, "e4m3"), scale_exponent(449.0, "e4m3")
    (8, 0, -1)
    """
    max_exponent = _format(fmt)[3]
    amax = float(np.float32(amax))
    if not (0 < amax < np.inf):
        return 0
    m, e = np.frexp(amax)
    k = max_exponent - int(e) - (1 if m > 0.875 else 0)
    return min(max(k, -126), 126)


def quantize_fp8(x: Any, fmt: str) -> tuple[np.ndarray, float]:
    """The reference of fp8.py's `to_fp8` for a float32 array: (the fp8 values q as float64, scale_inv
    = 2^-k), so x is about q * scale_inv. bf16 inputs are given as the float32 values they stand for.

    >>> q, scale_inv = quantize_fp8(np.array([0.5, -0.3], dtype=np.float32), "e4m3")
    >>> q.tolist(), scale_inv
    ([256.0, -160.0], 0.001953125)
    """
    x = np.asarray(x, dtype=np.float32)
    amax = float(np.max(np.abs(x))) if x.size else 0.0
    k = scale_exponent(amax, fmt)
    return round_to_fp8(x.astype(np.float64) * 2.0**k, fmt), 2.0**-k


def delayed_exponent(history: Any, fmt: str, margin: int = 0) -> int:
    """k for a tensor scaled from the absolute maxima of its earlier steps (delayed scaling: the kernel that
    makes the tensor casts it as it goes, so the scale must be known before): scale_exponent of the largest
    finite entry of `history` (float32 values; inf and NaN entries, from a step that overflowed, are left
    out), less `margin` (binades of headroom for a tensor that grows past its history); 0 when none is
    finite and positive.

    >>> delayed_exponent([0.5, 3.0, np.inf, np.nan], "e4m3"), delayed_exponent([0.0, np.nan], "e5m2")
    (7, 0)
    """
    h = np.asarray(history, dtype=np.float32)
    finite = h[np.isfinite(h)]
    amax = float(finite.max()) if finite.size else 0.0
    return scale_exponent(amax, fmt) - margin if amax > 0 else 0


def quantize_fp8_scaled(x: Any, k: int, fmt: str) -> tuple[np.ndarray, int]:
    """x (float32 values) cast with a given scale 2^k, as a kernel with a delayed scale casts it: (the fp8
    values of x * 2^k, rounded to nearest even and saturating, as float64; how many saturated, i.e. had
    |x * 2^k| beyond the format's largest value; NaN is not counted).

    >>> q, n = quantize_fp8_scaled(np.array([1.0, -2.0, 600.0], dtype=np.float32), 8, "e4m3")
    >>> q.tolist(), n
    ([256.0, -448.0, 448.0], 2)
    """
    scaled = np.asarray(x, dtype=np.float32).astype(np.float64) * 2.0**k
    with np.errstate(invalid="ignore"):
        saturated = int(np.count_nonzero(np.abs(scaled) > largest(fmt)))
    return round_to_fp8(scaled, fmt), saturated
