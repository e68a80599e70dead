"""decode_attention_forward (RoPE, cache write, attention of one new token per row) against a float64
reference written out here: the rotation by explicit angles, each row's prefix attended with plain NumPy.
The CPU runs the op's reference path; the GPU tests run the kernel (float32) over the shapes of issue 17's
test matrix: head sizes 64 and 128, GQA groups 1, 3 and 12, cache lengths 1 to 8192."""

from __future__ import annotations

import numpy as np
import pytest

import euler_kernels as ek
from euler_kernels.cuda import cast

THETA = 10000.0


def rotate(x: np.ndarray, position: int) -> np.ndarray:
    """x (..., D) rotated rotate-half style by the angles position * THETA ** (-2 i / D), in float64."""
    d = x.shape[-1]
    angle = position * THETA ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    c, s = np.cos(angle), np.sin(angle)
    x1, x2 = x[..., : d // 2].astype(np.float64), x[..., d // 2 :].astype(np.float64)
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def expected(qkv, k_cache, v_cache, pos, hq):
    """(out (B, Hq D), the caches after the write), all float64."""
    b, hkv, _, d = k_cache.shape
    k_after, v_after = k_cache.astype(np.float64), v_cache.astype(np.float64)
    out = np.zeros((b, hq, d))
    for row, p in enumerate(pos):
        q = rotate(qkv[row, : hq * d].reshape(hq, d), p)
        k_after[row, :, p] = rotate(qkv[row, hq * d : (hq + hkv) * d].reshape(hkv, d), p)
        v_after[row, :, p] = qkv[row, (hq + hkv) * d :].reshape(hkv, d)
        for h in range(hq):
            keys, values = k_after[row, h // (hq // hkv), : p + 1], v_after[row, h // (hq // hkv), : p + 1]
            scores = keys @ q[h] / np.sqrt(d)
            w = np.exp(scores - scores.max())
            out[row, h] = w @ values / w.sum()
    return out.reshape(b, hq * d), k_after, v_after


def inputs(rng, b, hq, hkv, s, d, pos, dtype=np.float64):
    qkv = rng.standard_normal((b, (hq + 2 * hkv) * d)).astype(dtype)
    k_cache, v_cache = (rng.standard_normal((b, hkv, s, d)).astype(dtype) for _ in range(2))
    cos, sin = ek.rope_tables(d, s, THETA, dtype=dtype)
    return qkv, k_cache, v_cache, np.asarray(pos, dtype=np.int64), cos, sin


@pytest.mark.parametrize("window", [None, 12])
def test_the_reference_path_equals_float64_attention_over_each_rows_prefix(window) -> None:
    rng = np.random.default_rng(0)
    b, hq, hkv, s, d = 4, 6, 2, 16, 8
    qkv, k, v, pos, cos, sin = inputs(rng, b, hq, hkv, s, d, [0, 3, 11, 6])
    want, k_want, v_want = expected(qkv, k, v, pos, hq)
    got = ek.decode_attention_forward(qkv, k, v, pos, cos, sin, hq, window=window)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k, k_want, rtol=1e-12, atol=1e-12)  # the new keys, rotated, at pos
    np.testing.assert_array_equal(v, v_want)


def test_t_new_tokens_a_row_equal_t_steps_of_one() -> None:
    """A speculative step's T tokens at pos..pos + T - 1: each sees the slots up to its own position, so
    the result (and the cache) is that of T consecutive one-token steps."""
    rng = np.random.default_rng(2)
    b, hq, hkv, s, d, t = 3, 6, 2, 20, 8, 4
    _, k, v, pos, cos, sin = inputs(rng, b, hq, hkv, s, d, [0, 7, 15])
    qkv = rng.standard_normal((b, t, (hq + 2 * hkv) * d))
    k_seq, v_seq, want = k.copy(), v.copy(), []
    for i in range(t):  # the float64 reference, one token at a time
        out, k_seq, v_seq = expected(qkv[:, i], k_seq, v_seq, pos + i, hq)
        want.append(out)
    got = ek.decode_attention_forward(qkv, k, v, pos, cos, sin, hq, window=19)
    np.testing.assert_allclose(got, np.stack(want, axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k, k_seq, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(v, v_seq)


@pytest.mark.parametrize(("t", "p"), [(1, 0), (1, 9), (3, 5)])
def test_one_sequence_equals_float64_attention_over_its_prefix(t, p) -> None:
    """B = 1 (generate's case) takes the NumPy path of slices: the same numbers as the reference, T new
    tokens at p..p + T - 1 each seeing the slots up to its own."""
    rng = np.random.default_rng(3 + t + p)
    hq, hkv, s, d = 6, 2, 16, 8
    _, k, v, pos, cos, sin = inputs(rng, 1, hq, hkv, s, d, [p])
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d))
    k_seq, v_seq, want = k.copy(), v.copy(), []
    for i in range(t):
        out, k_seq, v_seq = expected(qkv[:, i], k_seq, v_seq, pos + i, hq)
        want.append(out)
    got = ek.decode_attention_forward(qkv if t > 1 else qkv[:, 0], k, v, pos, cos, sin, hq, window=s)
    np.testing.assert_allclose(got.reshape(1, t, -1), np.stack(want, axis=1), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k, k_seq, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(v, v_seq)


@pytest.mark.parametrize("p", [0, 7, 40])
def test_one_sequences_chain_is_t_one_token_steps_bit_for_bit(p) -> None:
    """NumPy, one sequence, float32: a speculative step's chain of T tokens gives the bits of the T one-token
    steps that would feed the same tokens (each token attends over exactly its own slots)."""
    rng = np.random.default_rng(p + 21)
    hq, hkv, s, d, t = 4, 2, 64, 32, 4
    _, k, v, pos, cos, sin = inputs(rng, 1, hq, hkv, s, d, [p], np.float32)
    qkv = rng.standard_normal((1, t, (hq + 2 * hkv) * d)).astype(np.float32)
    together = ek.decode_attention_forward(qkv, k.copy(), v.copy(), pos, cos, sin, hq, window=s)
    k1, v1 = k.copy(), v.copy()
    for i in range(t):
        alone = ek.decode_attention_forward(qkv[:, i], k1, v1, pos + i, cos, sin, hq, window=s)
        np.testing.assert_array_equal(together[:, i], alone)


def expected_tree(qkv, k_cache, v_cache, pos, hq, parents):
    """(out (B, T, Hq D), the caches after the write) of a draft tree's T new tokens, float64: token i at
    position pos + depth(i), its key and value at slot pos + i, seeing the old slots and its ancestors'."""
    b, hkv, _, d = k_cache.shape
    t = qkv.shape[1]
    depth, ancestors = [0], [[0]]
    for i, parent in enumerate(parents, start=1):
        depth.append(depth[parent] + 1)
        ancestors.append([*ancestors[parent], i])
    k_after, v_after = k_cache.astype(np.float64), v_cache.astype(np.float64)
    out = np.zeros((b, t, hq, d))
    for row, p in enumerate(pos):
        for i in range(t):
            k_after[row, :, p + i] = rotate(
                qkv[row, i, hq * d : (hq + hkv) * d].reshape(hkv, d), p + depth[i]
            )
            v_after[row, :, p + i] = qkv[row, i, (hq + hkv) * d :].reshape(hkv, d)
        for i in range(t):
            q = rotate(qkv[row, i, : hq * d].reshape(hq, d), p + depth[i])
            slots = [*range(p), *(p + u for u in ancestors[i])]
            for h in range(hq):
                keys, values = k_after[row, h // (hq // hkv), slots], v_after[row, h // (hq // hkv), slots]
                scores = keys @ q[h] / np.sqrt(d)
                w = np.exp(scores - scores.max())
                out[row, i, h] = w @ values / w.sum()
    return out.reshape(b, t, hq * d), k_after, v_after


TREES = [(0, 1, 0), (0, 1, 0, 3), (0, 0, 1, 2), (0, 1, 2)]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("parents", TREES)
def test_a_draft_tree_equals_float64_attention_over_each_tokens_path(parents, rows) -> None:
    """Each fed token of a draft tree sees the old slots and its ancestors' (one sequence: the NumPy path
    of slices; three: the batched reference); a chain given as a tree is the chain."""
    rng = np.random.default_rng(len(parents) + rows)
    hq, hkv, s, d, t = 6, 2, 24, 8, len(parents) + 1
    _, k, v, pos, cos, sin = inputs(rng, rows, hq, hkv, s, d, [9, 0, 17][:rows])
    qkv = rng.standard_normal((rows, t, (hq + 2 * hkv) * d))
    want, k_want, v_want = expected_tree(qkv, k, v, pos, hq, parents)
    got = ek.decode_attention_forward(qkv, k, v, pos, cos, sin, hq, window=s, tree=parents)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(k, k_want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(v, v_want)


def test_bad_trees_are_named() -> None:
    rng = np.random.default_rng(4)
    _, k, v, pos, cos, sin = inputs(rng, 1, 4, 2, 16, 4, [3])
    qkv = rng.standard_normal((1, 3, 32))
    with pytest.raises(ValueError, match="a tree of 4 tokens for 3 new tokens"):
        ek.decode_attention_forward(qkv, k, v, pos, cos, sin, 4, tree=(0, 1, 0))
    with pytest.raises(ValueError, match=r"parents\[i - 1\] in 0..i - 1"):
        ek.decode_attention_forward(qkv, k, v, pos, cos, sin, 4, tree=(0, 2))


def test_bad_shapes_are_named() -> None:
    rng = np.random.default_rng(1)
    qkv, k, v, pos, cos, sin = inputs(rng, 2, 4, 2, 8, 4, [1, 2])
    with pytest.raises(ValueError, match=r"qkv must be \(B, \[T,\] \(Hq \+ 2 Hkv\) D\)"):
        ek.decode_attention_forward(qkv[:, :-4], k, v, pos, cos, sin, 4)
    with pytest.raises(ValueError, match="pos must be"):
        ek.decode_attention_forward(qkv, k, v, pos[:1], cos, sin, 4)
    with pytest.raises(ValueError, match="float32 or all float64"):
        ek.decode_attention_forward(qkv.astype(np.float32), k, v, pos, cos, sin, 4)


# (Hq, Hkv, D, S, positions of the rows): GQA groups 1, 3, 12; the first and last slots, a chunk's
# edges (D 64: 32 slots a block, D 128: 16), and long caches
GPU_CASES = [
    (4, 4, 64, 1, [0]),
    (12, 4, 64, 64, [0, 31, 32, 63]),
    (12, 1, 64, 129, [128, 7, 64]),
    (12, 4, 64, 512, [511, 0, 200]),
    (16, 4, 128, 2048, [2047, 15, 16, 1000]),
    (12, 1, 128, 8192, [8191, 4100]),
    (8, 8, 128, 7, [6, 2]),
    (6, 2, 16, 40, [39, 5]),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hkv", "d", "s", "pos"), GPU_CASES)
def test_the_kernel_equals_float64_attention(hq, hkv, d, s, pos) -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(s + d)
    qkv, k, v, pos, cos, sin = inputs(rng, len(pos), hq, hkv, s, d, pos, np.float32)
    want, k_want, v_want = expected(qkv, k, v, pos, hq)
    gk, gv = cp.asarray(k), cp.asarray(v)
    assert ek.decode_attention_kernel(gk, hq)
    tables = cp.asarray(cos), cp.asarray(sin)
    got = ek.decode_attention_forward(cp.asarray(qkv), gk, gv, cp.asarray(pos), *tables, hq)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cp.asnumpy(gk), k_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cp.asnumpy(gv), v_want.astype(np.float32))
    untouched = np.ones(k.shape, dtype=bool)
    untouched[np.arange(len(pos)), :, pos] = False
    np.testing.assert_array_equal(cp.asnumpy(gk)[untouched], k[untouched])  # no other slot is written


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "s", "pos"), [(12, 4, 64, 512, [0, 30, 500]), (16, 4, 128, 300, [15, 290])]
)
def test_the_kernel_with_t_new_tokens_a_row_equals_t_steps_of_one(hq, hkv, d, s, pos) -> None:
    """Four new tokens a row (a speculative step), across the blocks' slot boundaries (32 or 16 slots)."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(11)
    t = 4
    _, k, v, pos, cos, sin = inputs(rng, len(pos), hq, hkv, s + t, d, pos, np.float32)
    qkv = rng.standard_normal((len(pos), t, (hq + 2 * hkv) * d)).astype(np.float32)
    k_seq, v_seq, want = k.copy(), v.copy(), []
    for i in range(t):
        out, k_seq, v_seq = expected(qkv[:, i], k_seq, v_seq, pos + i, hq)
        want.append(out)
    gk, gv = cp.asarray(k), cp.asarray(v)
    assert ek.decode_attention_kernel(gk, hq, t)
    tables = cp.asarray(cos), cp.asarray(sin)
    got = ek.decode_attention_forward(cp.asarray(qkv), gk, gv, cp.asarray(pos), *tables, hq)
    assert got.shape == (len(pos), t, hq * d)
    np.testing.assert_allclose(cp.asnumpy(got), np.stack(want, axis=1), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cp.asnumpy(gk), k_seq, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cp.asnumpy(gv), v_seq.astype(np.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("parents", TREES)
@pytest.mark.parametrize(
    ("hq", "hkv", "d", "s", "pos"), [(12, 4, 64, 512, [0, 29, 500]), (16, 4, 128, 300, [14])]
)
def test_the_kernel_with_a_draft_tree_equals_float64_attention(parents, hq, hkv, d, s, pos) -> None:
    """A tree's tokens across the blocks' slot boundaries (32 or 16 slots)."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(13)
    t = len(parents) + 1
    _, k, v, pos, cos, sin = inputs(rng, len(pos), hq, hkv, s + t, d, pos, np.float32)
    qkv = rng.standard_normal((len(pos), t, (hq + 2 * hkv) * d)).astype(np.float32)
    want, k_want, v_want = expected_tree(qkv, k, v, pos, hq, parents)
    gk, gv = cp.asarray(k), cp.asarray(v)
    assert ek.decode_attention_kernel(gk, hq, t)
    tables = cp.asarray(cos), cp.asarray(sin)
    got = ek.decode_attention_forward(cp.asarray(qkv), gk, gv, cp.asarray(pos), *tables, hq, tree=parents)
    np.testing.assert_allclose(cp.asnumpy(got), want, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(cp.asnumpy(gk), k_want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(cp.asnumpy(gv), v_want.astype(np.float32))


@pytest.mark.gpu
def test_t_new_tokens_are_t_one_token_steps_bit_for_bit() -> None:
    """A speculative step's chain and the plain steps that would feed the same tokens give the same bits
    (so speculation emits plain greedy's tokens), across a block's slot boundary."""
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(17)
    hq, hkv, d, s, t = 12, 4, 64, 300, 4
    _, k, v, pos, cos, sin = (cp.asarray(a) for a in inputs(rng, 2, hq, hkv, s, d, [29, 200], np.float32))
    qkv = cp.asarray(rng.standard_normal((2, t, (hq + 2 * hkv) * d)).astype(np.float32))
    together = ek.decode_attention_forward(qkv, k.copy(), v.copy(), pos, cos, sin, hq, bf16_out=True)
    k1, v1 = k.copy(), v.copy()
    for i in range(t):
        alone = ek.decode_attention_forward(qkv[:, i], k1, v1, pos + i, cos, sin, hq, bf16_out=True)
        cp.testing.assert_array_equal(together[:, i], alone)


@pytest.mark.gpu
def test_the_bf16_output_is_the_float32_one_rounded() -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(5)
    qkv, k, v, pos, cos, sin = (cp.asarray(a) for a in inputs(rng, 2, 12, 4, 300, 64, [299, 40], np.float32))
    out = ek.decode_attention_forward(qkv, k.copy(), v.copy(), pos, cos, sin, 12)
    out16 = ek.decode_attention_forward(qkv, k, v, pos, cos, sin, 12, bf16_out=True)
    assert out16.dtype == cp.uint16
    cp.testing.assert_array_equal(out16, cast.to_bf16(out))


@pytest.mark.gpu
def test_the_kernel_replayed_in_a_cuda_graph_equals_eager() -> None:
    cp = pytest.importorskip("cupy")
    rng = np.random.default_rng(3)
    arrays = inputs(rng, 3, 12, 4, 256, 64, [5, 100, 255], np.float32)
    qkv, k, v, pos, cos, sin = (cp.asarray(a) for a in arrays)
    eager = ek.decode_attention_forward(qkv, k.copy(), v.copy(), pos, cos, sin, 12)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        ek.decode_attention_forward(qkv, k.copy(), v.copy(), pos, cos, sin, 12)  # compile outside capture
        gk, gv = k.copy(), v.copy()
        stream.begin_capture()
        out = ek.decode_attention_forward(qkv, gk, gv, pos, cos, sin, 12)
        graph = stream.end_capture()
        graph.launch(stream=stream)
        stream.synchronize()
    cp.testing.assert_array_equal(out, eager)
