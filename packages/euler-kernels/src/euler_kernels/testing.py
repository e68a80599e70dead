"""Hypothesis strategies for shapes and arrays, and host-side references (bf16 rounding, a norm-wise
relative error), reusable in any project's tests.

Needs hypothesis (`pip install euler-kernels[testing]`); `import euler_kernels` alone does not.

>>> from hypothesis import given
>>> from euler_kernels.testing import attention_shapes, normal_arrays
>>> @given(shape=attention_shapes())
... def test_shape(shape):
...     assert shape.n_heads % shape.n_kv_heads == 0 and shape.seq_len <= shape.kv_len
>>> test_shape()
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

Shape = tuple[int, ...]


def batch_sizes(max_value: int = 3) -> st.SearchStrategy[int]:
    """Batch sizes 1 .. max_value."""
    return st.integers(1, max_value)


def seq_lens(max_value: int = 8) -> st.SearchStrategy[int]:
    """Sequence lengths 1 .. max_value (T = 1 is always possible and shrunk towards)."""
    return st.integers(1, max_value)


def head_dims(max_value: int = 16) -> st.SearchStrategy[int]:
    """Even head dimensions 2 .. max_value (RoPE needs an even D)."""
    return st.integers(1, max_value // 2).map(lambda h: 2 * h)


def vocab_sizes(min_value: int = 2, max_value: int = 64) -> st.SearchStrategy[int]:
    """Vocabulary sizes."""
    return st.integers(min_value, max_value)


@st.composite
def head_counts(draw: st.DrawFn, max_kv_heads: int = 4, max_groups: int = 4) -> tuple[int, int]:
    """(n_heads, n_kv_heads) with n_heads a multiple of n_kv_heads: MHA (groups 1), GQA, MQA (1 KV head)."""
    hkv = draw(st.integers(1, max_kv_heads))
    return hkv * draw(st.integers(1, max_groups)), hkv


class AttentionShape(NamedTuple):
    """Sizes of one attention call.

    q is (batch, seq_len, n_heads, head_dim); k and v are (batch, kv_len, n_kv_heads, head_dim).
    """

    batch: int
    seq_len: int
    kv_len: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    @property
    def q(self) -> Shape:
        return (self.batch, self.seq_len, self.n_heads, self.head_dim)

    @property
    def kv(self) -> Shape:
        return (self.batch, self.kv_len, self.n_kv_heads, self.head_dim)


@st.composite
def attention_shapes(
    draw: st.DrawFn,
    max_batch: int = 2,
    max_len: int = 8,
    max_kv_heads: int = 3,
    max_groups: int = 3,
    max_head_dim: int = 8,
    kv_cache: bool = True,
) -> AttentionShape:
    """Grouped-query attention sizes: n_heads = n_kv_heads * groups (groups = 1 is plain multi-head,
    n_kv_heads = 1 is multi-query); with `kv_cache`, kv_len may exceed seq_len (a decode step)."""
    t = draw(seq_lens(max_len))
    s = draw(st.integers(t, max_len)) if kv_cache else t
    hq, hkv = draw(head_counts(max_kv_heads, max_groups))
    d = draw(head_dims(max_head_dim))
    return AttentionShape(draw(batch_sizes(max_batch)), t, s, hq, hkv, d)


def shapes(min_dims: int = 1, max_dims: int = 3, max_side: int = 5) -> st.SearchStrategy[Shape]:
    """Array shapes with every side >= 1."""
    return hnp.array_shapes(min_dims=min_dims, max_dims=max_dims, min_side=1, max_side=max_side)


@st.composite
def normal_arrays(
    draw: st.DrawFn,
    shape: Shape | st.SearchStrategy[Shape],
    dtype: type = np.float64,
    scales: Sequence[float] = (0.1, 1.0, 3.0),
) -> np.ndarray:
    """Gaussian arrays: hypothesis draws the shape, a seed and a scale; values are N(0, scale**2).
    Good for gradient checks: generic values, no accidental ties, still shrinkable and replayable."""
    shape = draw(shape) if isinstance(shape, st.SearchStrategy) else shape
    seed = draw(st.integers(0, 2**32 - 1))
    scale = draw(st.sampled_from(list(scales)))
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def float_arrays(
    shape: Shape | st.SearchStrategy[Shape], dtype: type = np.float64, max_magnitude: float = 1e4
) -> st.SearchStrategy[np.ndarray]:
    """Arrays of finite floats in [-max_magnitude, max_magnitude], element by element (hypothesis likes
    zeros, repeated values and the extremes, so these find edge cases such as huge logits)."""
    elements = st.floats(-max_magnitude, max_magnitude, allow_nan=False, allow_infinity=False, width=32)
    return hnp.arrays(np.dtype(dtype), shape, elements=elements)


def large_logits(shape: Shape | st.SearchStrategy[Shape], dtype: type = np.float64) -> st.SearchStrategy:
    """Logit arrays whose entries reach +-1e4 (plus ordinary ones), for log-softmax stability tests."""
    return normal_arrays(shape, dtype=dtype, scales=(1.0, 1e2, 1e4))


def token_arrays(shape: Shape | st.SearchStrategy[Shape], vocab_size: int) -> st.SearchStrategy[np.ndarray]:
    """Integer token ids in [0, vocab_size)."""
    return hnp.arrays(np.int64, shape, elements=st.integers(0, vocab_size - 1))


def loss_masks(shape: Shape | st.SearchStrategy[Shape], dtype: type = np.float64) -> st.SearchStrategy:
    """0/1 masks; all-zero and all-one masks are drawn on purpose (edge cases), else mixed."""
    ones = hnp.arrays(np.dtype(dtype), shape, elements=st.just(1.0))
    zeros = hnp.arrays(np.dtype(dtype), shape, elements=st.just(0.0))
    mixed = hnp.arrays(np.dtype(dtype), shape, elements=st.sampled_from([0.0, 1.0]))
    return st.one_of(zeros, ones, mixed)


def bf16_bits(x: Any) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16) on the host, round half to even: the NumPy reference for
    the GPU's cast (finite and infinite inputs; NaN payloads are not handled).

    >>> bf16_bits(np.array([1.0, 1.0 + 2.0**-8, -2.0], np.float32)).tolist()  # halfway goes to even
    [16256, 16256, 49152]
    """
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_values(bits: Any) -> np.ndarray:
    """bfloat16 bit patterns (NumPy or CuPy uint16) -> the float32 values they stand for, on the host."""
    bits = bits.get() if hasattr(bits, "get") else np.asarray(bits)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def relative_error(a: Any, b: Any, floor: float = 1e-2) -> float:
    """Norm-wise relative error of a against the reference b (NumPy or CuPy). A reference that cancels
    to (nearly) zero is judged against an RMS floor of its size instead of against its own rounding noise.

    >>> relative_error(np.array([1.0, 2.0]), np.array([1.0, 2.0]))
    0.0
    """
    a = np.asarray(a.get() if hasattr(a, "get") else a, np.float64)
    b = np.asarray(b.get() if hasattr(b, "get") else b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), floor * np.sqrt(b.size)))
