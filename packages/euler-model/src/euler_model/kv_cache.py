"""A key/value cache for generation, preallocated to the context length, with rollback."""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_model.config import ModelConfig


class KVCache:
    """Per-layer keys and values (n_layers, B, context, Hkv, D); `length` positions are filled.

    >>> from euler_model.config import preset
    >>> cache = KVCache(preset("tiny"), batch=1)
    >>> cache.k.shape, cache.length
    ((2, 1, 16, 2, 4), 0)
    """

    def __init__(
        self, config: ModelConfig, batch: int = 1, dtype: Any = np.float32, xp: Any = np, slots: int = 0
    ) -> None:
        """slots: the positions it can hold (default the context; a prompt's prefill needs only its own)."""
        slots = slots or config.context
        shape = (config.n_layers, batch, slots, config.n_kv_heads, config.head_dim)
        self.k = xp.zeros(shape, dtype=dtype)
        self.v = xp.zeros(shape, dtype=dtype)
        self.context = slots
        self.length = 0

    def append(self, layer: int, k: Any, v: Any) -> tuple[Any, Any]:
        """Write k, v (B, T, Hkv, D) after the filled positions; return every cached key and value.

        The position only moves on with advance(), once every layer has appended its keys.
        """
        end = self.length + k.shape[1]
        if end > self.context:
            raise ValueError(f"KVCache.append: {end} positions exceed the cache's {self.context} slots")
        self.k[layer, :, self.length : end] = k
        self.v[layer, :, self.length : end] = v
        return self.k[layer, :, :end], self.v[layer, :, :end]  # (B, S, Hkv, D)

    def advance(self, t: int) -> None:
        """Mark t more positions as filled (called once per forward, after all layers)."""
        self.length += t

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on (rejected speculative drafts)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"KVCache.rollback: length {length} is not in [0, {self.length}]")
        self.length = length
