"""How many of one tiny-preset `loss_and_grads` call's Python calls only decide which path to take.

    python benchmarks/count_path_calls.py [--json]

Every call the interpreter makes (Python functions and C functions alike, as `sys.setprofile` sees them)
during one `loss_and_grads` of the `tiny` preset on the CPU (batch 2 x 16 tokens, after one call to warm
up) is counted, and so are the calls made to decide a path: to the functions below that tell what kind an
array is, which kernels may run or which precision applies, and every call made inside them. Validation
(`check_float`) is counted among them. Reads of the environment during the call are counted too (there
should be none: the precision is a value passed down, euler_kernels/precision.py).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

import numpy as np

DECIDING = {
    "is_bf16",
    "get_array_module",
    "check_float",
    "check_activations",
    "float32_on_gpu",
    "fused_grads",
    "is_fp8",
    "is_capturing",
    "_bf16_product",
    "_lean_takes",
    "_kernel_takes",
    "bf16_path",
    "_fp8_fits",
    "bf16",
    "fp8",
    "tf32_attention",
    "bf16_bits",
}


class RecordingEnviron(collections.abc.MutableMapping):
    """os.environ's stand-in that counts every read."""

    def __init__(self, real: Any) -> None:
        self.real, self.reads = real, collections.Counter()

    def __getitem__(self, key: str) -> str:
        self.reads[key] += 1
        return self.real[key]

    def __setitem__(self, key: str, value: str) -> None:
        self.real[key] = value

    def __delitem__(self, key: str) -> None:
        del self.real[key]

    def __iter__(self) -> Any:
        return iter(self.real)

    def __len__(self) -> int:
        return len(self.real)

    def __contains__(self, key: object) -> bool:
        self.reads[str(key)] += 1
        return key in self.real


def count() -> dict[str, Any]:
    """{"calls", "deciding", "share", "by_function", "environment_reads"} of one loss_and_grads."""
    from euler_model import init_params, loss_and_grads, preset

    cfg = preset("tiny")
    params = init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.vocab_size, (2, 16))
    targets = rng.integers(0, cfg.vocab_size, (2, 16 + cfg.n_mtp_heads - 1))
    loss_and_grads(cfg, params, tokens, targets)  # imports, caches and tables made once
    totals = {"calls": 0, "deciding": 0}
    by_function: collections.Counter = collections.Counter()
    inside: list[bool] = []  # per Python frame: whether it runs inside a deciding function

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            name = frame.f_code.co_name if event == "call" else getattr(arg, "__name__", "?")
            deciding = bool(inside and inside[-1]) or (event == "call" and name in DECIDING)
            totals["calls"] += 1
            if deciding:
                totals["deciding"] += 1
                by_function[name] += 1
            if event == "call":
                inside.append(deciding)
        elif event == "return" and inside:
            inside.pop()

    environ, os.environ = os.environ, RecordingEnviron(os.environ)
    try:
        sys.setprofile(profile)
        try:
            loss_and_grads(cfg, params, tokens, targets)
        finally:
            sys.setprofile(None)
        reads = dict(os.environ.reads)
    finally:
        os.environ = environ  # noqa: B003 (the real mapping put back, not a new environment)
    return {
        **totals,
        "share": totals["deciding"] / totals["calls"],
        "by_function": dict(by_function.most_common(10)),
        "environment_reads": reads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    figures = count()
    if parser.parse_args().json:
        print(json.dumps(figures))
        return
    print(f"python calls in one tiny loss_and_grads (CPU): {figures['calls']}")
    print(f"  deciding a path: {figures['deciding']} ({100 * figures['share']:.1f}%)")
    for name, n in figures["by_function"].items():
        print(f"    {n:5d}  {name}")
    print(f"  environment reads: {sum(figures['environment_reads'].values())}")


if __name__ == "__main__":
    main()
