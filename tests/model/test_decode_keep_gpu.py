"""Decoders kept across calls on the GPU (decode_batch.py): a kept decoder's later calls, with its prefill
replayed from a CUDA graph, give the tokens of a fresh uncaptured decode, also after the weights change in
place or the precision changes, and two generators streaming at once do not share one."""

from __future__ import annotations

import numpy as np
import pytest

from euler_kernels import Precision
from euler_model import GenerationStats, decode_batch, generate, generate_batch, preset
from tests.model.test_generate import scaled_params
from tests.model.test_generate_batch_gpu import on_gpu, prompts_for

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cp():
    return pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def no_kept_decoders():
    decode_batch.release_kept_decoders()
    yield
    decode_batch.release_kept_decoders()


CAPTURABLE = preset("small", n_heads=2, n_kv_heads=1)  # head_dim 64: the prefill's attention is flash


def replayed_prefills() -> list:
    """The prompt-length patterns whose prefill the kept decoders hold as CUDA graphs."""
    return [key[1] for d in decode_batch._kept.values() for key in d.runner.graphs if key[0] == "prefill"]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("speculative", [False, True])
def test_later_calls_replay_the_prefill_with_the_same_tokens(cp, precision, speculative) -> None:
    mode = Precision(precision)
    cfg = CAPTURABLE
    gpu = on_gpu(cp, scaled_params(cfg, 0, np.float32, scale=4.0))
    prompts, limits = prompts_for(cfg, [16, 1, 40, 7]), [60, 127, 30, 0]
    want = generate_batch(cfg, gpu, prompts, limits, temperature=0.0, cuda_graph=False, precision=mode)
    runs, stats = [], []
    for _ in range(3):  # 1: the decoder made; 2: the prefill recorded too; 3: the prefill replayed
        stats.append(GenerationStats())
        kw = {"speculative": speculative, "stats": stats[-1], "precision": mode}
        runs.append(generate_batch(cfg, gpu, prompts, limits, 0.0, **kw))
    assert runs == [want] * 3
    # the prefill is keyed by the rows' prompt lengths, shortest first
    assert len(decode_batch._kept) == 1 and replayed_prefills() == [(1, 7, 16, 40)]
    assert all(s.decode == "cuda graph" for s in stats)
    if speculative:
        assert stats[0].drafted > 0 and len({(s.drafted, s.accepted) for s in stats}) == 1


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_weights_changed_in_place_are_decoded_with_their_new_values(cp, precision) -> None:
    """A trainer updates the weights in place between two evaluations: the kept decoder's copies and the
    replayed prefill must read the new values."""
    mode = Precision(precision)
    cfg = CAPTURABLE
    gpu = on_gpu(cp, scaled_params(cfg, 1, np.float32, scale=4.0))
    prompts = prompts_for(cfg, [12, 12], seed=3)
    before = [generate_batch(cfg, gpu, prompts, 40, 0.0, speculative=True, precision=mode) for _ in range(2)]
    for name, value in scaled_params(cfg, 2, np.float32, scale=4.0).items():
        gpu[name][...] = cp.asarray(value)  # same arrays, new values
    after = generate_batch(cfg, gpu, prompts, 40, 0.0, speculative=True, precision=mode)
    assert replayed_prefills() == [(12, 12)]
    assert after == generate_batch(cfg, gpu, prompts, 40, temperature=0.0, cuda_graph=False, precision=mode)
    assert after != before[0] and before[0] == before[1]


def test_a_prefill_that_cannot_be_recorded_runs_eagerly(cp) -> None:
    """head_dim 32: the prefill's attention goes through CuPy's matmul, which refuses stream capture. The
    prefill stays eager (it is not tried again), the step is still a graph, and the tokens are the same."""
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 0, np.float32, scale=4.0))
    prompts = prompts_for(cfg, [16, 5], seed=8)
    want = generate_batch(cfg, gpu, prompts, 50, temperature=0.0, cuda_graph=False)
    for _ in range(3):
        stats = GenerationStats()
        assert generate_batch(cfg, gpu, prompts, 50, temperature=0.0, stats=stats) == want
        assert stats.decode == "cuda graph"
    (decoder,) = decode_batch._kept.values()
    assert replayed_prefills() == [] and decoder.runner.uncaptured == {("prefill", (5, 16))}


def test_a_precision_change_makes_a_new_decoder(cp) -> None:
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 3, np.float32, scale=4.0))
    prompts = prompts_for(cfg, [20], seed=4)
    for precision in ("fp32", "fp32", "bf16", "bf16"):
        mode = Precision(precision)
        got = generate_batch(cfg, gpu, prompts, 50, temperature=0.0, precision=mode)
        want = generate_batch(cfg, gpu, prompts, 50, temperature=0.0, cuda_graph=False, precision=mode)
        assert got == want, precision
        assert [d.precision for d in decode_batch._kept.values()] == [mode], precision


def test_two_generators_streaming_at_once_each_get_their_own_tokens(cp) -> None:
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 4, np.float32, scale=4.0))
    a, b = prompts_for(cfg, [9, 25], seed=5)
    want_a, want_b = (c.tokens for c in generate_batch(cfg, gpu, [a, b], 30, 0.0, cuda_graph=False))
    first, second = generate(cfg, gpu, a, 30, temperature=0.0), generate(cfg, gpu, b, 30, temperature=0.0)
    got_a, got_b = [], []
    for _ in range(30):  # one token of each in turn: the second finds the kept decoder busy
        got_a.append(next(first))
        got_b.append(next(second))
    assert (got_a, got_b) == (want_a, want_b)


def test_a_generator_closed_early_gives_its_decoder_back(cp) -> None:
    cfg = preset("small")
    gpu = on_gpu(cp, scaled_params(cfg, 5, np.float32, scale=4.0))
    (prompt,) = prompts_for(cfg, [10], seed=6)
    stream = generate(cfg, gpu, prompt, 40, temperature=0.0)
    next(stream)
    (decoder,) = decode_batch._kept.values()
    assert decoder.busy
    stream.close()
    assert not decoder.busy
    want = generate_batch(cfg, gpu, [prompt], 40, temperature=0.0, cuda_graph=False)[0].tokens
    assert [list(generate(cfg, gpu, prompt, 40, temperature=0.0)) for _ in range(3)] == [want] * 3
    assert list(decode_batch._kept.values()) == [decoder]


def test_the_kept_decoders_of_a_model_share_their_weights(cp) -> None:
    """Decoders of two batch sizes and a speculative one: one set of plain weight copies between the first
    two, the speculative one with its drafting heads; every call still the uncaptured tokens."""
    cfg = CAPTURABLE
    gpu = on_gpu(cp, scaled_params(cfg, 6, np.float32, scale=4.0))
    one, two = prompts_for(cfg, [9], seed=9), prompts_for(cfg, [9, 14], seed=10)
    for prompts in (one, two, one, two):
        want = generate_batch(cfg, gpu, prompts, 30, temperature=0.0, cuda_graph=False)
        assert generate_batch(cfg, gpu, prompts, 30, temperature=0.0) == want
        assert generate_batch(cfg, gpu, prompts, 30, 0.0, speculative=True) == want
    plain = [d for (_, _, tree), d in decode_batch._kept.items() if tree is None]
    spec = [d for (_, _, tree), d in decode_batch._kept.items() if tree is not None]
    assert len(plain) == len(spec) == 2
    assert plain[0].weights is plain[1].weights and spec[0].weights is spec[1].weights
    assert "drafters" in spec[0].weights and "drafters" not in plain[0].weights
