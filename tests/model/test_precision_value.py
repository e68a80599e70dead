"""The precision is a value passed down, not environment variables read by the ops at call time.

- one tiny-preset loss_and_grads on the CPU reads no environment variable, and at most 10% of its Python
  calls decide a path (benchmarks/count_path_calls.py, run as a user runs it);
- the packages' source reads the environment only where the reason is not a kernel choice;
- on NumPy arrays every precision computes the same numbers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import euler_kernels as ek
from euler_model import init_params, loss_and_grads, preset

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = REPO_ROOT / "packages"
ENV_READ = re.compile(r"os\.environ|os\.getenv|getenv\(")
# the environment reads the packages keep, none of which chooses a kernel or a precision
ALLOWED = {
    "euler-kernels/src/euler_kernels/cuda/_module.py": "EULER_CACHE_DIR: where compiled kernels are cached",
    "euler-data/src/euler_data/network.py": "the data mirror, offline mode, a download base",
    "euler-data/src/euler_data/db.py": "DuckDB's memory limit",
    "euler-data/src/euler_data/sources.py": "a download base (tests serve sources locally)",
    "euler-train/src/euler_train/distributed.py": "the launcher's rank, world size and NCCL id",
    "euler-train/src/euler_train/socket_comm.py": "the socket backend's timeout and port",
    "euler-train/src/euler_train/config.py": "EULER_COMM: the CPU world's backend",
    "euler-train/src/euler_train/device.py": "a note for the old kernel switches, read when a run is planned",
}


def test_one_cpu_step_reads_no_environment_and_mostly_computes():
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    script = [sys.executable, str(REPO_ROOT / "benchmarks" / "count_path_calls.py"), "--json"]
    proc = subprocess.run(script, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(proc.stdout)
    assert figures["environment_reads"] == {}
    assert figures["share"] <= 0.10, figures


def test_the_packages_read_the_environment_only_for_reasons_other_than_kernels():
    readers = set()
    for path in PACKAGES.glob("*/src/**/*.py"):
        if ENV_READ.search(path.read_text(encoding="utf-8")):
            readers.add(str(path.relative_to(PACKAGES)))
    assert readers <= set(ALLOWED), sorted(readers - set(ALLOWED))
    kernels_and_model = [r for r in readers if r.startswith(("euler-kernels", "euler-model"))]
    assert kernels_and_model == ["euler-kernels/src/euler_kernels/cuda/_module.py"]


@pytest.mark.parametrize("matmul", ["tf32", "bf16", "bf16fast", "fp8"])
def test_every_precision_computes_the_same_on_numpy(matmul):
    cfg = preset("tiny")
    params = init_params(cfg, seed=1)
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, cfg.vocab_size, (2, 9))
    targets = rng.integers(0, cfg.vocab_size, (2, 9 + cfg.n_mtp_heads - 1))
    exact_loss, exact = loss_and_grads(cfg, params, tokens, targets)
    loss, grads = loss_and_grads(cfg, params, tokens, targets, precision=ek.Precision(matmul))
    assert loss == exact_loss
    for name in params:
        np.testing.assert_array_equal(grads[name], exact[name])


def test_a_precision_is_checked_and_hashable():
    assert ek.Precision("bf16", "mma", False) == ek.Precision("bf16", "mma", False)
    assert len({ek.Precision(), ek.EXACT, ek.Precision("tf32")}) == 2  # decoders are kept per precision
    with pytest.raises(ValueError, match="matmul must be one of fp32, tf32, bf16, bf16fast, fp8, got 'half'"):
        ek.Precision("half")
    with pytest.raises(ValueError, match="attention_kernel must be one of auto, sm90, mma, got 'wgmma'"):
        ek.Precision(attention_kernel="wgmma")
    with pytest.raises(ValueError, match="gemm_tuning must be true or false"):
        ek.Precision(gemm_tuning="yes")
