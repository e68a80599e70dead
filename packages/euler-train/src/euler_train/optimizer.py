"""The optimizers over a flat params dict: AdamW (decay on matrices only) and Muon + AdamW.

The training step updates through `update(params, grads, control)`: every per-step scalar (clip factor,
skip flag, lr, bias corrections) comes from the control vector of `euler_kernels.step_control`, fed by
`hyper(lr)`; `step` is the same update with the scalars from the host (for use outside the trainer).

>>> import numpy as np
>>> params = {"w": np.ones((2, 2)), "norm": np.ones(2)}
>>> opt = AdamW(params, weight_decay=0.1)
>>> opt.step(params, {"w": np.ones((2, 2)), "norm": np.ones(2)}, lr=0.1)
>>> opt.t
1
"""

from __future__ import annotations

from typing import Any

import numpy as np

from euler_kernels import (
    adamw_hyper,
    adamw_update_ctl,
    adamw_update_many,
    get_array_module,
    muon_scratch,
    muon_update,
)
from euler_model.cpu_threads import cpu_workers, run_parts
from euler_train.config import TrainConfig


class AdamW:
    """First and second moments per parameter, keyed like `params`; `t` counts updates from 0. Its
    update can rewrite bf16 copies of the weights in the same pass (`writes_bf16_copies`)."""

    writes_bf16_copies = True

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

    def decays(self, params: dict[str, Any]) -> list[float]:
        """Each parameter's weight decay, in params' order: matrices (ndim >= 2) decay, vectors do not."""
        return [self.weight_decay if p.ndim >= 2 else 0.0 for p in params.values()]

    def hyper(self, lr: float, enable: bool = True) -> Any:
        """step_control's host input for the next update: float32 [lr, bc1, bc2, enable] (NumPy)."""
        return adamw_hyper(lr, self.t + 1, self.beta1, self.beta2, enable)

    def update(
        self,
        params: dict[str, Any],
        grads: dict[str, Any],
        control: Any,
        hyper: Any = None,
        copies: dict[str, Any] | None = None,
    ) -> None:
        """Update every parameter in place from `control` (no host read on the GPU: capturable); the
        caller counts the update (`t += 1`) once it knows control's apply flag was set. `hyper` is unused
        (every AdamW scalar is in control): it is there so AdamW and Muon take the same arguments.
        copies: name -> bf16 copy of that weight (GPU), rewritten from the updated weight in the same
        launch (so the next forward need not cast it)."""
        names = list(params)
        adamw_update_ctl(
            [params[n] for n in names],
            [self.m[n] for n in names],
            [self.v[n] for n in names],
            [grads[n] for n in names],
            self.decays(params),
            control,
            self.beta1,
            self.beta2,
            self.eps,
            None if copies is None else [copies.get(n) for n in names],
        )

    def step(self, params: dict[str, Any], grads: dict[str, Any], lr: float) -> None:
        """One update with learning rate lr and no clipping (one fused launch on the GPU)."""
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
            weight_decays=self.decays(params),
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


def balanced_parts(shapes: list[tuple[int, ...]], n: int) -> list[list[int]]:
    """The indices of `shapes` split into at most n parts of about equal Newton-Schulz work (rows x cols x
    min(rows, cols) per matrix), largest first onto the least loaded part; each part in index order.

    >>> balanced_parts([(4, 4), (8, 8), (4, 4), (2, 2)], 2)
    [[1], [0, 2, 3]]
    """
    work = [r * c * min(r, c) for r, c in shapes]
    count = max(1, min(n, len(shapes)))
    loads, parts = [0] * count, [[] for _ in range(count)]
    for i in sorted(range(len(shapes)), key=lambda i: -work[i]):
        k = loads.index(min(loads))
        loads[k] += work[i]
        parts[k].append(i)
    return [sorted(part) for part in parts if part]


def muon_names(params: dict[str, Any]) -> list[str]:
    """The weights Muon trains: every 2-D matrix inside the blocks (q, k, v, o, gate, up, down)."""
    return [n for n, p in params.items() if n.startswith("layers.") and p.ndim == 2]


class Muon:
    """Muon for the blocks' matrices, AdamW for the embedding, the output heads and the norm gains.

    Both follow the trainer's warmup + cosine schedule; Muon's learning rate is `lr` x (muon_lr / the
    AdamW peak), carried to the device as hyper[4]. `t` counts updates (AdamW's bias correction)."""

    LR_SLOT = 4  # hyper = [lr, bc1, bc2, enable, muon lr]

    def __init__(self, params: dict[str, Any], tcfg: TrainConfig) -> None:
        self.names = muon_names(params)
        others = {n: p for n, p in params.items() if n not in self.names}
        self.adam = AdamW(others, tcfg.beta1, tcfg.beta2, tcfg.eps, tcfg.weight_decay)
        self.ratio = tcfg.muon_lr / tcfg.lr if tcfg.lr > 0 else 0.0
        self.momentum, self.weight_decay = tcfg.muon_momentum, tcfg.weight_decay
        self.bufs = {n: params[n] * 0 for n in self.names}  # momentum, zeros like the weights
        on_gpu = bool(self.names) and get_array_module(params[self.names[0]]) is not np
        self.scratch = muon_scratch([params[n] for n in self.names]) if on_gpu else None  # fixed addresses

    @property
    def t(self) -> int:
        return self.adam.t

    @t.setter
    def t(self, value: int) -> None:
        self.adam.t = value

    def hyper(self, lr: float, enable: bool = True) -> Any:
        """AdamW's [lr, bc1, bc2, enable] with Muon's learning rate appended."""
        return np.append(self.adam.hyper(lr, enable), np.float32(lr * self.ratio))

    def update(self, params: dict[str, Any], grads: dict[str, Any], control: Any, hyper: Any) -> None:
        """Both groups' updates from the control vector and hyper (capturable on the GPU)."""
        rest = [n for n in params if n not in self.bufs]
        self.adam.update({n: params[n] for n in rest}, {n: grads[n] for n in rest}, control, hyper)
        if self.scratch is not None:  # GPU: one call, the matrices of a shape stacked
            self._muon(self.names, params, grads, control, hyper)
            return
        # NumPy: the matrices spread over the step's worker threads, BLAS at one thread in each; a
        # multi-threaded BLAS on these small products stalls on a loaded machine (cpu_threads.py)
        shapes = [params[n].shape for n in self.names]
        parts = [[self.names[i] for i in part] for part in balanced_parts(shapes, cpu_workers(len(shapes)))]
        run_parts(lambda names: self._muon(names, params, grads, control, hyper), parts)

    def _muon(self, names: list[str], params: dict[str, Any], grads: dict[str, Any], control: Any,
              hyper: Any) -> None:  # fmt: skip
        muon_update(
            [params[n] for n in names],
            [self.bufs[n] for n in names],
            [grads[n] for n in names],
            control,
            hyper,
            self.LR_SLOT,
            momentum=self.momentum,
            nesterov=True,
            weight_decay=self.weight_decay,
            scratch=self.scratch,
        )

    def state_tensors(self) -> dict[str, Any]:
        """AdamW's `m.<name>` / `v.<name>` and Muon's momentum `muon.<name>`."""
        return {**self.adam.state_tensors(), **{f"muon.{n}": b for n, b in self.bufs.items()}}

    def load_state_tensors(self, tensors: dict[str, Any], t: int, xp: Any) -> None:
        self.adam.load_state_tensors(tensors, t, xp)
        for name, current in self.bufs.items():
            key = f"muon.{name}"
            if key not in tensors or tuple(tensors[key].shape) != tuple(current.shape):
                got = tensors[key].shape if key in tensors else "missing"
                raise ValueError(f"Muon.load_state_tensors: {key} expected {current.shape}, got {got}")
            self.bufs[name] = xp.asarray(tensors[key], dtype=current.dtype)


def state_names(params: dict[str, Any], tcfg: TrainConfig) -> dict[str, str]:
    """The keys of make_optimizer(params, tcfg).state_tensors(), each with its parameter's name, without
    making the state (ZeRO gathers every rank's share under these keys)."""
    muon = set(muon_names(params)) if tcfg.optimizer == "muon" else set()
    kinds = {n: ("muon",) if n in muon else ("m", "v") for n in params}
    return {f"{kind}.{n}": n for n in params for kind in kinds[n]}


def make_optimizer(params: dict[str, Any], tcfg: TrainConfig) -> AdamW | Muon:
    """train.optimizer: "adamw" (every weight) or "muon" (Muon for the block matrices, AdamW the rest)."""
    if tcfg.optimizer == "muon":
        return Muon(params, tcfg)
    return AdamW(params, tcfg.beta1, tcfg.beta2, tcfg.eps, tcfg.weight_decay)
