"""Activation recomputation: keep only the stream entering each layer, re-run the layer in the backward.

Without it, trunk_forward keeps every layer's kernel caches until trunk_backward consumes them, per token
and layer 8C + 2Ckv + Hq + 3F floats (memory.py), which is what makes long contexts and large batches
run out of memory. With `recompute=True` it keeps a LayerInput per layer instead: the stream (x, branch)
entering the layer, 2C float32 per token (the arrays the next layer reads anyway), and the references
the layer's forward needs. trunk_backward then re-runs each layer's forward from it, right before the
layer's backward, so only one layer's caches exist at a time.

The re-run is the same ops on the same arrays as the first forward, so its caches and therefore every
gradient are bitwise those of the step without recomputation (tests/model/test_recompute.py); the cost
is a second forward of the blocks, about a third more matrix-product work per step. On the GPU it adds
only kernel launches of the shapes the step already has, so the step stays capturable as a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from euler_kernels import EXACT, Precision
from euler_model.blocks import LayerCache, layer_forward
from euler_model.config import ModelConfig


@dataclass(frozen=True)
class LayerInput:
    """What re-running layer `index`'s forward needs: the stream entering it and the forward's inputs.

    >>> import numpy as np
    >>> from euler_model import preset, init_params
    >>> from euler_model.model import rope_for
    >>> cfg = preset("tiny"); p = init_params(cfg); x = np.ones((2 * 3, cfg.dim), np.float32)
    >>> saved = LayerInput(cfg, p, 0, (x, None), (2, 3), rope_for(cfg, x), False)
    >>> cache = saved.caches()  # the layer's blocks.LayerCache, as layer_forward made it
    >>> type(cache.attention).__name__, type(cache.ffn).__name__
    ('AttentionBlockCache', 'FFNBlockCache')
    """

    config: ModelConfig
    params: dict[str, Any]  # the forward's weights (with the bf16 copies on the GPU's bf16 path)
    index: int
    stream: tuple[Any, Any]  # (x, branch) of (N, C) entering the layer; branch is None before layer 0
    bt: tuple[int, int]  # (B, T)
    rope: tuple[Any, Any]  # cos/sin tables
    bf16: bool
    keep: bool = False  # the bf16 caches keep the norms' outputs and the SwiGLU product (blocks.py)
    precision: Precision = EXACT  # how the products and attention are computed

    def caches(self) -> LayerCache:
        """The layer's cache, made again by its forward."""
        inputs = (self.config, self.params, self.index, self.stream, self.bt, self.rope)
        _, cache = layer_forward(*inputs, None, self.bf16, self.keep, self.precision)
        return cache


def layer_caches(saved: LayerCache | LayerInput) -> LayerCache:
    """A layer's caches from what trunk_forward kept for it: the caches themselves, or a LayerInput's
    re-run."""
    return saved.caches() if isinstance(saved, LayerInput) else saved
