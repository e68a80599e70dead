"""The serve engine on the GPU (skipped without CUDA): its forward captured as a CUDA graph and replayed,
and every request's tokens those of generate_batch on the same weights, greedy and seeded-sampled."""

from __future__ import annotations

import threading

import pytest

import euler_kernels as ek
import euler_model
from euler_model.sampling import Picker
from euler_train.sampling import SamplingModel
from euler_train.serve.engine import Engine, Request

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("matmul", ["fp32", "bf16"])
def test_the_engine_decodes_what_generate_batch_decodes_with_its_forward_captured(matmul):
    import cupy as cp

    cfg = euler_model.preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=1).items()}
    precision = ek.Precision(matmul)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [9], [10, 11, 12, 13]]
    pickers = [Picker(0.0), Picker(0.0), Picker(0.9, top_k=20, top_p=0.9), Picker(0.0)]
    want = []
    for prompt, picker in zip(prompts, pickers):  # each request alone, through generate_batch
        kw = {"temperature": picker.temperature, "top_k": picker.top_k, "top_p": picker.top_p}
        done = euler_model.generate_batch(cfg, params, [prompt], 20, seeds=[7], precision=precision, **kw)
        want.append(done[0].tokens)
    engine = Engine(SamplingModel(cfg, params, tokenizer=None, precision=precision), slots=8)
    got: list[list[int]] = [[] for _ in prompts]
    finished = threading.Semaphore(0)
    try:
        for i, (prompt, picker) in enumerate(zip(prompts, pickers)):
            request = Request(prompt, 20, picker, set(), 7, lambda t, lp, top, spec, i=i: got[i].append(t),
                              lambda reason: finished.release())  # fmt: skip
            engine.submit(request)
        for _ in prompts:
            assert finished.acquire(timeout=120)
    finally:
        engine.close()
    assert got == want
    assert engine.runner.mode == "cuda graph" and engine.steps > 0


def test_speculative_serving_on_the_gpu_gives_plain_decodings_tokens():
    import cupy as cp

    cfg = euler_model.preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=2).items()}
    model = SamplingModel(cfg, params, tokenizer=None, precision=ek.Precision("bf16"))
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    pickers = [Picker(0.0), Picker(0.8, top_p=0.9), Picker(0.0)]
    results = {speculative: decode(Engine(model, slots=4, speculative=speculative), prompts, pickers, 24)
               for speculative in (False, True)}  # fmt: skip
    assert results[True] == results[False]


def decode(engine: Engine, prompts: list[list[int]], pickers: list[Picker], limit: int) -> list[list[int]]:
    """Every prompt through the engine (seed 3), each request's tokens; the engine closed after."""
    got: list[list[int]] = [[] for _ in prompts]
    finished = threading.Semaphore(0)

    def collect(i: int):
        return lambda token, logprob, top, spec: got[i].append(token)

    try:
        for i, (prompt, picker) in enumerate(zip(prompts, pickers)):
            engine.submit(
                Request(prompt, limit, picker, set(), 3, collect(i), lambda reason: finished.release())
            )
        for _ in prompts:
            assert finished.acquire(timeout=120)
    finally:
        engine.close()
    return got
