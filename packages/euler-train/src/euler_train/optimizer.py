"""AdamW over a flat params dict through `euler_kernels.adamw_update_many`, decay on matrices only.

>>> import numpy as np
>>> params = {"w": np.ones((2, 2)), "norm": np.ones(2)}
>>> opt = AdamW(params, weight_decay=0.1)
>>> opt.step(params, {"w": np.ones((2, 2)), "norm": np.ones(2)}, lr=0.1)
>>> opt.t
1
"""

from __future__ import annotations

from typing import Any

from euler_kernels import adamw_update_many


class AdamW:
    """First and second moments per parameter, keyed like `params`; `t` counts updates from 0."""

    def __init__(
        self,
        params: dict[str, Any],
        beta1: float = 0.9,
        beta2: float = 0.95,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        self.beta1, self.beta2, self.eps, self.weight_decay = beta1, beta2, eps, weight_decay
        self.m = {name: p * 0 for name, p in params.items()}  # zeros of the same kind, shape and dtype
        self.v = {name: p * 0 for name, p in params.items()}
        self.t = 0

    def step(self, params: dict[str, Any], grads: dict[str, Any], lr: float) -> None:
        """Update every parameter in place (one fused launch on the GPU); decay only where ndim >= 2."""
        self.t += 1
        names = list(params)
        adamw_update_many(
            [params[n] for n in names],
            [self.m[n] for n in names],
            [self.v[n] for n in names],
            [grads[n] for n in names],
            self.t,
            lr,
            beta1=self.beta1,
            beta2=self.beta2,
            eps=self.eps,
            weight_decays=[self.weight_decay if params[n].ndim >= 2 else 0.0 for n in names],
        )

    def state_tensors(self) -> dict[str, Any]:
        """Moments as one flat dict for safetensors: `m.<name>` and `v.<name>`."""
        out = {f"m.{name}": m for name, m in self.m.items()}
        out.update({f"v.{name}": v for name, v in self.v.items()})
        return out

    def load_state_tensors(self, tensors: dict[str, Any], t: int, xp: Any) -> None:
        """Restore moments saved by `state_tensors` (checked against the params' names and shapes)."""
        for kind, store in (("m", self.m), ("v", self.v)):
            for name, current in store.items():
                key = f"{kind}.{name}"
                if key not in tensors or tuple(tensors[key].shape) != tuple(current.shape):
                    got = tensors[key].shape if key in tensors else "missing"
                    raise ValueError(f"AdamW.load_state_tensors: {key} expected {current.shape}, got {got}")
                store[name] = xp.asarray(tensors[key], dtype=current.dtype)
        self.t = t
