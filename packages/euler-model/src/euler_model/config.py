"""ModelConfig: the decoder's hyper-parameters, validated, with the presets tiny / small / gpu / 350m / 1b."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of the Llama-style decoder with K multi-token-prediction heads.

    >>> cfg = ModelConfig(dim=16, n_heads=4, n_kv_heads=2, n_layers=2, ffn_dim=32, context=16, vocab_size=64)
    >>> cfg.head_dim
    4
    """

    dim: int = 128  # model width C (embedding and residual stream)
    n_heads: int = 4  # query heads; head_dim = dim // n_heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention); divides n_heads
    n_layers: int = 4  # transformer blocks
    ffn_dim: int = 384  # hidden width of the SwiGLU feed-forward
    context: int = 128  # maximum sequence length (RoPE table and KV-cache size)
    vocab_size: int = 512  # token ids are in [0, vocab_size)
    n_mtp_heads: int = 4  # K output heads; head k predicts token t + 1 + k (K = 1: plain next-token)
    mtp_conditioned: bool = False  # heads k >= 1 see token t + k too: W_k (h + P_k e(x_{t+k}))
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon

    def __post_init__(self) -> None:
        for name in ("dim", "n_heads", "n_kv_heads", "n_layers", "ffn_dim", "context", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ModelConfig: {name} must be a positive int, got {value!r}")
        if not isinstance(self.n_mtp_heads, int) or self.n_mtp_heads < 1:
            raise ValueError(f"ModelConfig: n_mtp_heads must be an int >= 1, got {self.n_mtp_heads!r}")
        if not isinstance(self.mtp_conditioned, bool) or (self.mtp_conditioned and self.n_mtp_heads < 2):
            raise ValueError(
                f"ModelConfig: mtp_conditioned must be a bool, and true only with n_mtp_heads >= 2, got "
                f"{self.mtp_conditioned!r} with {self.n_mtp_heads} heads"
            )
        if self.dim % self.n_heads:
            raise ValueError(f"ModelConfig: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig: n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig: head_dim = dim // n_heads = {self.head_dim} must be even (RoPE)")
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ValueError(
                f"ModelConfig: rope_theta ({self.rope_theta}) and norm_eps ({self.norm_eps}) must be > 0"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.dim // self.n_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and value) projection: n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Inverse of to_dict; unknown keys are an error (a typo must not pass silently)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"ModelConfig.from_dict: unknown keys {unknown}; known keys are {sorted(known)}")
        return cls(**d)

    def replace(self, **overrides: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **overrides)


PRESETS: dict[str, ModelConfig] = {
    # tiny: for tests; a float64 whole-model gradcheck of every tensor runs in seconds
    "tiny": ModelConfig(
        dim=16, n_heads=4, n_kv_heads=2, n_layers=2, ffn_dim=32, context=16, vocab_size=64, n_mtp_heads=3
    ),
    # small: ~1.1M parameters, trains on a CPU in minutes
    "small": ModelConfig(
        dim=128, n_heads=4, n_kv_heads=2, n_layers=4, ffn_dim=384, context=128, vocab_size=512, n_mtp_heads=4
    ),
    # gpu: ~116.4M parameters, one GPU
    "gpu": ModelConfig(
        dim=768,
        n_heads=12,
        n_kv_heads=4,
        n_layers=16,
        ffn_dim=2048,
        context=512,
        vocab_size=4096,
        n_mtp_heads=4,
    ),
    # 350m: 337.7M parameters (dim 1024, 16 q / 4 kv heads of 64, 24 layers), one next-token head
    "350m": ModelConfig(
        dim=1024,
        n_heads=16,
        n_kv_heads=4,
        n_layers=24,
        ffn_dim=2816,
        context=1024,
        vocab_size=32768,
        n_mtp_heads=1,
    ),
    # 1b: 855.7M parameters (dim 2048, 16 q / 4 kv heads of 128, 16 layers), one next-token head
    "1b": ModelConfig(
        dim=2048,
        n_heads=16,
        n_kv_heads=4,
        n_layers=16,
        ffn_dim=5632,
        context=1024,
        vocab_size=32768,
        n_mtp_heads=1,
    ),
    # 3b: 2,617.4M parameters (dim 3072, 24 q / 8 kv heads of 128, 24 layers), context 2048
    "3b": ModelConfig(
        dim=3072,
        n_heads=24,
        n_kv_heads=8,
        n_layers=24,
        ffn_dim=8192,
        context=2048,
        vocab_size=32768,
        n_mtp_heads=1,
    ),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A preset by name, with optional field overrides.

    >>> preset("small", vocab_size=1024).vocab_size
    1024
    """
    if name not in PRESETS:
        raise ValueError(f"preset: unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]
