"""Parameter names and shapes, the parameter count, and the scaled initialisation."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from euler_model.config import ModelConfig

INIT_STD = 0.02  # standard deviation of every matrix (GPT-2 / nanoGPT scheme)


def param_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and shape, in a fixed order; linear weights are (out, in).

    >>> from euler_model.config import preset
    >>> param_shapes(preset("tiny"))["layers.0.wk"]
    (8, 16)
    """
    c, f, v = config.dim, config.ffn_dim, config.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"embed": (v, c)}
    for i in range(config.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm"] = (c,)
        shapes[p + "wq"] = (c, c)
        shapes[p + "wk"] = (config.kv_dim, c)
        shapes[p + "wv"] = (config.kv_dim, c)
        shapes[p + "wo"] = (c, c)
        shapes[p + "ffn_norm"] = (c,)
        shapes[p + "w_gate"] = (f, c)
        shapes[p + "w_up"] = (f, c)
        shapes[p + "w_down"] = (c, f)
    shapes["norm"] = (c,)
    for k in range(config.n_mtp_heads):
        shapes[f"heads.{k}"] = (v, c)
    if config.mtp_conditioned:  # P_k: what head k adds to h from the embedding of token t + k
        for k in range(1, config.n_mtp_heads):
            shapes[f"heads_cond.{k}"] = (c, c)
    return shapes


def count_params(config: ModelConfig) -> int:
    """Total number of parameters (embedding and all K heads included).

    >>> from euler_model.config import preset
    >>> count_params(preset("small"))
    1115264
    """
    return sum(math.prod(shape) for shape in param_shapes(config).values())


def product_params(config: ModelConfig) -> int:
    """Parameters in the weights of matrix products: every matrix but the embedding (the layers' projections
    and the heads), whose gradients loss_and_grads_on_device(bf16_grads=True) makes bf16.

    >>> from euler_model.config import preset
    >>> config = preset("small")
    >>> product_params(config) == count_params(config) - config.vocab_size * config.dim - config.dim * (
    ...     2 * config.n_layers + 1)
    True
    """
    shapes = param_shapes(config).items()
    return sum(math.prod(shape) for name, shape in shapes if len(shape) == 2 and name != "embed")


def describe_params(config: ModelConfig) -> str:
    """A short human-readable summary of the parameter count, e.g. 'small: 1,115,264 parameters (1.1M)'."""
    n = count_params(config)
    per_layer = sum(math.prod(s) for k, s in param_shapes(config).items() if k.startswith("layers.0."))
    heads = config.n_mtp_heads * config.vocab_size * config.dim
    return (
        f"{n:,} parameters ({n / 1e6:.1f}M): embedding {config.vocab_size * config.dim:,}, "
        f"{config.n_layers} layers x {per_layer:,}, final norm {config.dim}, "
        f"{config.n_mtp_heads} heads {heads:,}"
    )


def init_params(config: ModelConfig, seed: int = 0, xp: Any = np, dtype: Any = np.float32) -> dict[str, Any]:
    """Fresh parameters as a flat dict of xp arrays.

    Scheme: every matrix ~ N(0, 0.02^2); the two residual projections of each block (wo and w_down)
    use std 0.02 / sqrt(2 * n_layers) so the residual stream's variance does not grow with depth;
    RMSNorm weights are 1. Drawn with a NumPy Generator, so a seed gives the same weights on CPU and GPU.

    >>> from euler_model.config import preset
    >>> p = init_params(preset("tiny"), seed=0)
    >>> p["layers.0.wq"].shape, float(p["norm"][0])
    ((16, 16), 1.0)
    """
    rng = np.random.default_rng(seed)
    residual_std = INIT_STD / math.sqrt(2 * config.n_layers)
    params = {}
    for name, shape in param_shapes(config).items():
        if name.endswith("norm"):
            value = np.ones(shape)
        else:
            std = residual_std if name.endswith((".wo", ".w_down")) else INIT_STD
            value = rng.normal(0.0, std, size=shape)
        params[name] = xp.asarray(value.astype(dtype))
    return params


def gradcheck_params(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """float64 parameters for a finite-difference check of the whole model: `init_params(config, seed)` with
    every matrix 10x its init scale and the norm gains 1 + 0.3 N(0, 1) instead of 1, so that every path
    carries a gradient well above rounding.

    >>> from euler_model.config import preset
    >>> p = gradcheck_params(preset("tiny"), seed=0)
    >>> bool((p["layers.0.wq"] == 10 * init_params(preset("tiny"), dtype=np.float64)["layers.0.wq"]).all())
    True
    """
    rng = np.random.default_rng(seed)
    init = init_params(config, seed=seed, dtype=np.float64)
    return {
        k: 1.0 + 0.3 * rng.standard_normal(v.shape) if k.endswith("norm") else 10 * v for k, v in init.items()
    }


def check_params(config: ModelConfig, params: dict[str, Any], where: str = "params") -> None:
    """Raise a ValueError naming every missing, unexpected or wrongly shaped tensor."""
    shapes = param_shapes(config)
    missing = [k for k in shapes if k not in params]
    extra = [k for k in params if k not in shapes]
    wrong = [
        f"{k}: {tuple(params[k].shape)} != {s}"
        for k, s in shapes.items()
        if k in params and tuple(params[k].shape) != s
    ]
    problems = {"missing": missing, "unexpected": extra, "wrong shapes": wrong}
    found = ", ".join(f"{kind} {names}" for kind, names in problems.items() if names)
    if found:
        raise ValueError(f"{where}: does not match the config: {found}")
