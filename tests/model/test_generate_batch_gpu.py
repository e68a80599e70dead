"""Batched generation on CuPy: the captured decode step equals the eager one, and both the CPU path."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels import Precision
from euler_model import GenerationStats, generate, generate_batch, init_params, preset
from tests.model.test_generate import scaled_params

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


def on_gpu(cp, params):
    return {k: cp.asarray(v) for k, v in params.items()}


def prompts_for(cfg, lengths, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in lengths]


def test_captured_greedy_equals_eager_and_the_cpu(cp) -> None:
    cfg = preset("small")
    params = scaled_params(cfg, 0, np.float32, scale=4.0)
    gpu = on_gpu(cp, params)
    prompts = prompts_for(cfg, [16, 1, 40, 100, 7])
    limits = [60, 127, 30, 40, 0]
    graph, eager = GenerationStats(), GenerationStats()
    captured = generate_batch(cfg, gpu, prompts, limits, temperature=0.0, stats=graph)
    uncaptured = generate_batch(cfg, gpu, prompts, limits, temperature=0.0, cuda_graph=False, stats=eager)
    assert graph.decode == "cuda graph" and eager.decode == "eager"
    assert captured == uncaptured
    want = [list(generate(cfg, params, p, n, temperature=0.0)) for p, n in zip(prompts, limits)]
    assert [c.tokens for c in captured] == want


def test_float64_on_the_gpu_equals_the_cpu(cp) -> None:
    """float64 products go through CuPy's matmul, which cannot be captured: eager, and still equal."""
    cfg = preset("small")
    params = scaled_params(cfg, 1, np.float64, scale=4.0)
    prompts = prompts_for(cfg, [16, 3, 50], seed=4)
    out = generate_batch(cfg, on_gpu(cp, params), prompts, 40, temperature=0.0, cuda_graph=False)
    assert [c.tokens for c in out] == [list(generate(cfg, params, p, 40, temperature=0.0)) for p in prompts]


def test_captured_sampling_equals_eager(cp) -> None:
    """Sampling on the device; if its sort cannot be captured, the steps run eagerly (stats.decode says so)
    and the output is the same either way."""
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 1, np.float32, scale=1.5))
    prompts = prompts_for(cfg, [5, 20, 9], seed=1)
    kw = {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "repetition_penalty": 1.2, "seeds": [1, 2, 3]}
    stats = GenerationStats()
    captured = generate_batch(cfg, gpu, prompts, 50, stats=stats, **kw)
    assert stats.decode == "cuda graph" or stats.decode.startswith("eager (CUDA graph capture failed")
    assert captured == generate_batch(cfg, gpu, prompts, 50, cuda_graph=False, **kw)


def test_gpu_sampling_equals_the_cpu_one_prompt_path(cp) -> None:
    cfg = preset("tiny")
    params = scaled_params(cfg, 2, np.float64, scale=2.0)
    prompts = prompts_for(cfg, [3, 8], seed=2)
    kw = {"temperature": 1.0, "top_p": 0.9}
    out = generate_batch(cfg, on_gpu(cp, params), prompts, 8, seeds=[4, 5], **kw)
    want = [list(generate(cfg, params, p, 8, seed=s, **kw)) for p, s in zip(prompts, [4, 5])]
    assert [c.tokens for c in out] == want


def test_bf16_weights_captured_equals_eager(cp) -> None:
    bf16 = Precision("bf16")
    cfg = preset("small")
    gpu = on_gpu(cp, init_params(cfg, seed=3))
    prompts = prompts_for(cfg, [16] * 4, seed=3)
    stats = GenerationStats()
    captured = generate_batch(cfg, gpu, prompts, 32, temperature=0.0, stats=stats, precision=bf16)
    assert stats.decode == "cuda graph"
    assert captured == generate_batch(
        cfg, gpu, prompts, 32, temperature=0.0, cuda_graph=False, precision=bf16
    )


@pytest.mark.parametrize(
    ("lengths", "limits", "precision"),
    [
        ([16, 1, 40, 100, 7], [60, 127, 30, 40, 0], "fp32"),  # 20 rows a step: the cuBLAS products
        ([16], [100], "fp32"),  # 4 rows a step: decode_linear's staged kernel
        ([30, 3], [90, 120], "bf16"),
    ],
)
def test_captured_speculative_equals_plain_greedy(cp, lengths, limits, precision) -> None:
    """The speculative step captured (T = K tokens a row, one graph) gives the plain captured step's
    tokens, with the products of its B K rows in cuBLAS (more than 8) or in decode_linear's kernel."""
    mode = Precision(precision)
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 0, np.float32, scale=4.0))
    prompts = prompts_for(cfg, lengths, seed=6)
    stats = GenerationStats()
    kw = {"temperature": 0.0, "precision": mode}
    fast = generate_batch(cfg, gpu, prompts, limits, speculative=True, stats=stats, **kw)
    assert stats.decode == "cuda graph" and stats.drafted > 0
    assert fast == generate_batch(cfg, gpu, prompts, limits, **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("tree", [(0,), (0, 1, 2)])
def test_captured_sampled_speculation_equals_plain_sampling(cp, tree, precision) -> None:
    """Sampling along a chain in the captured speculative step: each token takes the draw (and the
    repetition penalty's seen tokens) it has in plain steps, so the tokens are plain sampling's."""
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 0, np.float32, scale=4.0))
    prompts = prompts_for(cfg, [16, 3], seed=8)
    kw = {
        "temperature": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.3,
        "seeds": [4, 5],
        "precision": Precision(precision),
    }
    stats = GenerationStats()
    fast = generate_batch(cfg, gpu, prompts, [80, 60], speculative=True, draft_tree=tree, stats=stats, **kw)
    assert stats.decode == "cuda graph" and stats.drafted > 0
    assert fast == generate_batch(cfg, gpu, prompts, [80, 60], **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sampled_speculation_with_accepted_drafts_on_the_gpu(cp, dtype) -> None:
    """A model whose heads have learnt a cycle (test_generate's): most sampled drafts are accepted, and the
    GPU's speculative tokens are its plain sampled ones, captured (float32) or eager (float64)."""
    from tests.model.test_generate import train_on_cycle

    cfg = preset("tiny")
    params, _ = train_on_cycle(cfg)
    gpu = {k: cp.asarray(v.astype(dtype)) for k, v in params.items()}
    kw = {"temperature": 1.0, "top_p": 0.95, "seeds": [3, 9]}
    stats = GenerationStats()
    chain = tuple(range(cfg.n_mtp_heads - 1))
    fast = generate_batch(
        cfg, gpu, [[4, 5, 6], [1]], 40, speculative=True, draft_tree=chain, stats=stats, **kw
    )
    assert fast == generate_batch(cfg, gpu, [[4, 5, 6], [1]], 40, **kw)
    assert stats.acceptance_rate > 0.5


@pytest.mark.gpu
@pytest.mark.parametrize("tree", [(0, 1, 0), (0, 0, 1, 2), (0, 1, 0, 3, 0)])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_captured_speculative_with_a_draft_tree_equals_plain_greedy(cp, tree, precision) -> None:
    """A draft tree in the captured step (masks in the attention kernel, accepted keys moved): the plain
    captured step's tokens."""
    mode = Precision(precision)
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 0, np.float32, scale=4.0))
    prompts = prompts_for(cfg, [1, 30], seed=7)
    stats = GenerationStats()
    kw = {"temperature": 0.0, "precision": mode}
    fast = generate_batch(cfg, gpu, prompts, [120, 90], speculative=True, draft_tree=tree, stats=stats, **kw)
    assert stats.decode == "cuda graph" and stats.drafted > 0
    assert fast == generate_batch(cfg, gpu, prompts, [120, 90], **kw)
