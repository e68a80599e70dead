"""ZeRO stage 1 (train.zero = 1): each rank keeps only its share of the optimizer state, the sharded run
computes the very numbers of the unsharded one, and its checkpoints hold the full state.

The two-rank worlds are CPU processes over the socket stand-in for NCCL (EULER_COMM=socket, `--gpus 2`).
"""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

import euler_model
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.metrics import read_metrics
from euler_train.optimizer import make_optimizer, state_names
from euler_train.zero import ShardedOptimizer, owners
from tests.train.test_world_resume import common, train


class RankOf(Comm):
    """Rank `rank` of a `world`-process world whose collectives are not needed (state layout only)."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world_size = rank, world


def tiny_params() -> tuple[dict, dict]:
    cfg = resolve_config("tiny")
    return euler_model.init_params(euler_model.preset("tiny", vocab_size=320), seed=0), cfg.train


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_state_names_are_the_optimizers_keys(optimizer) -> None:
    params, tcfg = tiny_params()
    tcfg = dataclasses.replace(tcfg, optimizer=optimizer)
    state = make_optimizer(params, tcfg).state_tensors()
    names = state_names(params, tcfg)
    assert set(names) == set(state)
    assert all(state[k].shape == params[n].shape for k, n in names.items())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_each_rank_keeps_a_disjoint_share_of_about_half_the_state(optimizer) -> None:
    params, tcfg = tiny_params()
    tcfg = dataclasses.replace(tcfg, optimizer=optimizer)
    full = make_optimizer(params, tcfg).state_tensors()
    shares = [ShardedOptimizer(params, tcfg, RankOf(r, 2)).inner.state_tensors() for r in (0, 1)]
    assert not set(shares[0]) & set(shares[1]) and set(shares[0]) | set(shares[1]) == set(full)
    total = sum(a.size for a in full.values())
    sizes = [sum(a.size for a in s.values()) for s in shares]
    largest = max(a.size for a in full.values())
    assert sum(sizes) == total and max(sizes) <= total / 2 + largest  # balanced to one tensor


def test_owners_are_balanced_and_deterministic() -> None:
    sizes = {f"p{i}": s for i, s in enumerate([50, 40, 30, 20, 10, 10])}
    got = owners(sizes, 3)
    assert got == owners(dict(reversed(list(sizes.items()))), 3)  # independent of the dict's order
    load = [sum(sizes[n] for n in got if got[n] == r) for r in range(3)]
    assert max(load) - min(load) <= max(sizes.values())


def run_two(dataset, out, optimizer: str, zero: int, *extra: str) -> None:
    argv = [*common(dataset, out), "--gpus", "2", "--batch-size", "2"]
    argv += ["--set", f'train.optimizer="{optimizer}"', "--set", f"train.zero={zero}", *extra]
    proc = train(argv)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_sharded_run_equals_unsharded_and_checkpoints_the_full_state(tmp_path, dataset, optimizer) -> None:
    run_two(dataset, tmp_path / "plain", optimizer, 0)
    run_two(dataset, tmp_path / "zero", optimizer, 1)
    plain = read_metrics(tmp_path / "plain" / "metrics.jsonl")
    zero = read_metrics(tmp_path / "zero" / "metrics.jsonl")
    assert [r["loss"] for r in zero] == [r["loss"] for r in plain]  # x + 0 = x: the same numbers
    for step in (4, 12):
        for file in ("model.safetensors", "optimizer.safetensors"):
            a = load_file(str(tmp_path / "plain" / "checkpoints" / f"step_{step}" / file))
            b = load_file(str(tmp_path / "zero" / "checkpoints" / f"step_{step}" / file))
            assert set(a) == set(b)
            for name in a:
                np.testing.assert_array_equal(b[name], a[name], err_msg=f"{file} {name}")
    # the full state resumes sharded again: each rank keeps its share of the step-4 checkpoint
    run = tmp_path / "resumed"
    (run / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "zero" / "checkpoints" / "step_4", run / "checkpoints" / "step_4")
    shutil.copyfile(tmp_path / "zero" / "config.toml", run / "config.toml")
    run_two(dataset, run, optimizer, 1, "--resume")
    a = load_file(str(tmp_path / "plain" / "checkpoints" / "step_12" / "model.safetensors"))
    b = load_file(str(run / "checkpoints" / "step_12" / "model.safetensors"))
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)
