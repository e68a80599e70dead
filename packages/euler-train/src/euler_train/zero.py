"""ZeRO stage 1 (train.zero = 1): each rank keeps the optimizer state of its own share of the weights and
updates only those; the updated weights are then all-gathered, so every rank holds every weight again.

Shares are whole parameters, dealt out largest first to the least-loaded rank: a pure function of the
shapes and the world size, the same on every rank. The gather sums, over ranks, each rank's own weights
with zeros in place of the others' (one all-reduce: x + 0 is exactly x), so a sharded step computes the
very numbers of an unsharded one. Checkpoints hold the full state, gathered the same way, so they do not
depend on the number of processes.

>>> owners({"a": 6, "b": 4, "c": 3}, 2)
{'a': 0, 'b': 1, 'c': 1}
"""

from __future__ import annotations

from typing import Any

import euler_kernels as ek
from euler_train.comm import Comm
from euler_train.config import TrainConfig
from euler_train.optimizer import make_optimizer, state_names


def owners(sizes: dict[str, int], world: int) -> dict[str, int]:
    """The rank that keeps each parameter's optimizer state: largest first, to the least-loaded rank."""
    load = [0] * world
    out = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        rank = min(range(world), key=lambda r: (load[r], r))
        out[name] = rank
        load[rank] += sizes[name]
    return dict(sorted(out.items()))


class ShardedOptimizer:
    """An AdamW or Muon (make_optimizer) over this rank's share of `params`, with the trainer's interface:
    `update` updates the share and all-gathers the weights; `state_tensors` gathers the full state (a
    collective: every rank calls it); `load_state_tensors` keeps this rank's share of a full state."""

    def __init__(self, params: dict[str, Any], tcfg: TrainConfig, comm: Comm) -> None:
        self.comm = comm
        self.owner = owners({n: int(p.size) for n, p in params.items()}, comm.world_size)
        self.own = [n for n in params if self.owner[n] == comm.rank]
        if not self.own:
            raise ValueError(f"ShardedOptimizer: {comm.world_size} ranks for {len(params)} parameters")
        self.inner = make_optimizer({n: params[n] for n in self.own}, tcfg)
        self.keys = state_names(params, tcfg)  # every state tensor's key -> its parameter's name
        self.params = params  # the weights (their shapes and array kind make the zeros a gather adds)

    @property
    def t(self) -> int:
        return self.inner.t

    @t.setter
    def t(self, value: int) -> None:
        self.inner.t = value

    def hyper(self, lr: float, enable: bool = True) -> Any:
        return self.inner.hyper(lr, enable)

    def update(self, params: dict[str, Any], grads: dict[str, Any], control: Any, hyper: Any) -> None:
        """Update this rank's share from `control`, then give every rank every updated weight."""
        self.inner.update({n: params[n] for n in self.own}, {n: grads[n] for n in self.own}, control, hyper)
        for name, p in params.items():
            if self.owner[name] != self.comm.rank:
                p[...] = 0  # the owner's copy arrives through the sum
        self.comm.allreduce_grads(params)

    def state_tensors(self) -> dict[str, Any]:
        """The full state (every rank's share), on every rank."""
        mine = self.inner.state_tensors()
        zeros = ek.get_array_module(next(iter(self.params.values()))).zeros_like
        full = {k: mine[k].copy() if k in mine else zeros(self.params[n]) for k, n in self.keys.items()}
        self.comm.allreduce_grads(full)
        return full

    def load_state_tensors(self, tensors: dict[str, Any], t: int, xp: Any) -> None:
        """This rank's share of a full state (saved by any number of processes)."""
        self.inner.load_state_tensors(tensors, t, xp)


def make_sharded_or_not(params: dict[str, Any], tcfg: TrainConfig, comm: Comm) -> Any:
    """train.zero = 1 on several processes: ShardedOptimizer; else the plain optimizer (one process is
    unchanged by train.zero)."""
    if tcfg.zero == 1 and comm.world_size > 1:
        return ShardedOptimizer(params, tcfg, comm)
    return make_optimizer(params, tcfg)
