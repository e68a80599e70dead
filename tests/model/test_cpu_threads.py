"""The NumPy step split over worker threads (euler_model.cpu_threads): as many workers as BLAS threads,
the same loss and gradients as one thread, and BLAS's own thread count restored after the step. Each case
runs in a child process, since the worker count is read from BLAS once per process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

# a float64 step of tiny with 5 rows (uneven slices), a fractional loss mask, ignored targets and one
# fully masked row; prints the worker count, BLAS threads after the step, and saves loss and gradients
CHILD = """
import json, sys
import numpy as np
import threadpoolctl
from euler_model import init_params, loss_and_grads, preset
from euler_model.cpu_threads import cpu_workers
cfg = preset("tiny")
params = {k: v.astype(np.float64) for k, v in init_params(cfg, seed=2).items()}
rng = np.random.default_rng(7)
tokens = rng.integers(0, cfg.vocab_size, (5, 11))
targets = rng.integers(0, cfg.vocab_size, (5, 11 + cfg.n_mtp_heads - 1))
targets[rng.random(targets.shape) < 0.2] = -100
mask = rng.random(targets.shape) * (rng.random(targets.shape) < 0.7)
mask[3] = 0.0
loss, grads = loss_and_grads(cfg, params, tokens, targets, mask)
blas = max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
np.savez(sys.argv[1], loss=loss, **grads)
print(json.dumps({"workers": cpu_workers(5), "blas_after": blas}))
"""


def run_step(tmp_path, threads: int) -> tuple[dict, dict]:
    out = tmp_path / f"step{threads}.npz"
    env = os.environ | {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(out)], capture_output=True, text=True, env=env, check=True
    )
    with np.load(out) as saved:
        return json.loads(proc.stdout), {k: saved[k] for k in saved.files}


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS caps its threads at the core count")
def test_worker_threads_give_the_one_thread_step(tmp_path) -> None:
    info1, one = run_step(tmp_path, 1)
    info2, two = run_step(tmp_path, 2)
    assert info1 == {"workers": 1, "blas_after": 1}
    assert info2 == {"workers": 2, "blas_after": 2}  # slices of 2 and 3 rows; BLAS back at 2 threads
    assert sorted(one) == sorted(two)
    for name in one:
        scale = np.abs(one[name]).max()
        assert scale > 0, name  # every tensor has a gradient here, so the comparison means something
        np.testing.assert_allclose(two[name], one[name], rtol=0, atol=1e-12 * scale, err_msg=name)


# generate_batch and generate on NumPy with two BLAS threads: the thread count their products saw, the
# caller's between streamed tokens, and after the calls
GENERATE_CHILD = """
import json
import threadpoolctl
import euler_kernels.matmul.linear as linear
from euler_model import generate, generate_batch, init_params, preset
seen, forward = set(), linear.linear_forward
def spy(*args, **kwargs):
    seen.add(max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"))
    return forward(*args, **kwargs)
import euler_kernels
euler_kernels.linear_forward = spy
cfg = preset("small")
params = init_params(cfg, seed=0)
out = generate_batch(cfg, params, [[1, 2, 3], [4, 5]], 3, temperature=0.0)
batch_seen, seen = sorted(seen), set()
between = set()  # the caller's BLAS threads between streamed tokens
for token in generate(cfg, params, [1, 2, 3], 3, temperature=0.0):
    between.add(max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas"))
blas = max(i["num_threads"] for i in threadpoolctl.threadpool_info() if i["user_api"] == "blas")
print(json.dumps({"batch": batch_seen, "stream": sorted(seen), "between": sorted(between), "after": blas,
                  "tokens": [len(c.tokens) for c in out]}))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS caps its threads at the core count")
def test_numpy_generation_holds_blas_at_one_thread_and_restores_it() -> None:
    """Both generation paths run their products with one BLAS thread; the caller keeps its own count."""
    env = os.environ | {"OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}
    proc = subprocess.run(
        [sys.executable, "-c", GENERATE_CHILD], capture_output=True, text=True, env=env, check=True
    )
    got = json.loads(proc.stdout)
    assert got == {"batch": [1], "stream": [1], "between": [2], "after": 2, "tokens": [3, 3]}


# float64 logits of every head for 5 rows (split 2 + 3 over two workers), saved for the parent
LOGITS_CHILD = """
import sys
import numpy as np
from euler_model import init_params, logits, preset
cfg = preset("tiny")
params = {k: v.astype(np.float64) for k, v in init_params(cfg, seed=3).items()}
tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, (5, 9))
np.save(sys.argv[1], logits(cfg, params, tokens, all_heads=True))
"""


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS caps its threads at the core count")
def test_logits_split_over_worker_threads_are_the_one_thread_logits(tmp_path) -> None:
    got = {}
    for threads in (1, 2):
        env = os.environ | {"OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
        out = tmp_path / f"logits{threads}.npy"
        subprocess.run([sys.executable, "-c", LOGITS_CHILD, str(out)], env=env, check=True)
        got[threads] = np.load(out)
    assert got[1].shape == got[2].shape == (3, 5, 9, 64)  # (K, B, T, V): rows back in order
    np.testing.assert_allclose(got[2], got[1], rtol=0, atol=1e-12 * np.abs(got[1]).max())
