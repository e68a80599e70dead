"""Data parallelism on the CPU: bucketing, the one-process world, rank sharding, and that two ranks'
all-reduced gradient equals one process's gradient on the doubled batch."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_train.distributed import Comm, buckets, env_world


@given(st.lists(st.integers(1, 100), min_size=1, max_size=30), st.integers(1, 300))
def test_buckets_keep_order_and_fill_up_to_the_size(sizes, limit) -> None:
    names = [f"p{i}" for i in range(len(sizes))]
    size_of = dict(zip(names, sizes))
    groups = buckets(names, size_of, limit)
    assert [n for g in groups for n in g] == names
    for g in groups[:-1]:
        assert sum(size_of[n] for n in g) >= limit  # a bucket closes only once it is full
        assert sum(size_of[n] for n in g[:-1]) < limit  # and not later than needed


def test_env_world_defaults_and_launcher_variables(monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert env_world() == (0, 1, 0)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert env_world() == (3, 4, 1)
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match="RANK=4"):
        env_world()


def test_single_process_world_is_the_identity() -> None:
    comm = Comm()
    g = {"w": np.arange(3.0)}
    comm.allreduce_grads(g)
    np.testing.assert_array_equal(g["w"], [0.0, 1.0, 2.0])
    assert comm.is_main and comm.allreduce_scalars([1.0, 2.0]) == [1.0, 2.0]


class RecordingComm(Comm):
    """Rank `rank` of a 2-process world simulated in one process: collectives add the peer's values,
    which were recorded by running the peer first (both ranks make the same calls in the same order)."""

    def __init__(self, rank: int, peer: RecordingComm | None = None) -> None:
        self.rank, self.world_size = rank, 2
        self.peer = peer
        self.scalars: list[list[float]] = []
        self.grads: list[dict] = []

    def allreduce_scalars(self, values):
        self.scalars.append(list(values))
        if self.peer is None:  # first pass: the peer's values are not known yet; assume equal
            return [2 * v for v in values]
        return [a + b for a, b in zip(values, self.peer.scalars[len(self.scalars) - 1])]

    def allreduce_grads(self, grads):
        self.grads.append({k: v.copy() for k, v in grads.items()})
        if self.peer is not None:
            for k in grads:
                grads[k] += self.peer.grads[len(self.grads) - 1][k]


def make_trainer(tmp_path, dataset, comm, batch_size: int, mode: str = "pretrain", init=None):
    from euler_train.config import DeviceConfig, resolve_config
    from euler_train.device import setup_device
    from euler_train.runspec import plan_run
    from euler_train.trainer import Trainer

    cfg = resolve_config(
        "tiny",
        overrides=[f"train.batch_size={batch_size}", f'data.dir="{dataset}"']
        + ([f'data.init="{init}"'] if init else []),
    )
    spec = plan_run(cfg, tmp_path / f"run{comm.rank}", mode)
    trainer = Trainer(spec, setup_device(DeviceConfig()), comm)
    trainer.setup()
    return trainer


@pytest.fixture(scope="module")
def one_head_run(tmp_path_factory, dataset):
    """SFT init with one output head: with K = 1 the token-weighted average over ranks is exact (with
    K > 1 each head normalises by its own count and ranks are weighted by head 0's, see the README)."""
    from euler_train.cli import main

    run = tmp_path_factory.mktemp("k1") / "run"
    argv = [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(run),
        "--steps",
        "1",
        "--no-progress",
        "--set",
        "model.context=64",
        "--set",
        "model.n_mtp_heads=1",
    ]
    assert main(argv) == 0
    return run


@pytest.mark.parametrize("mode", ["pretrain", "sft"])
def test_two_ranks_equal_one_process_with_twice_the_batch(tmp_path, dataset, one_head_run, mode) -> None:
    init = one_head_run if mode == "sft" else None

    def trainer(name, comm, batch_size):
        return make_trainer(tmp_path / name, dataset, comm, batch_size, mode, init)

    loss_1, grads_1 = trainer("one", Comm(), 4).gradients(step=3)
    # first passes learn each rank's scalars (token weights); second passes use the true totals
    first0, first1 = trainer("a0", RecordingComm(0), 2), trainer("a1", RecordingComm(1), 2)
    first0.gradients(step=3)
    first1.gradients(step=3)
    rank1 = trainer("b1", RecordingComm(1, peer=first0.comm), 2)
    loss_r1, _ = rank1.gradients(step=3)
    rank0 = trainer("b0", RecordingComm(0, peer=rank1.comm), 2)
    loss_r0, grads_0 = rank0.gradients(step=3)
    assert loss_r0 + loss_r1 == pytest.approx(loss_1, rel=1e-6)  # what step_once's all-reduce adds up
    for name in grads_1:
        np.testing.assert_allclose(grads_0[name], grads_1[name], rtol=1e-4, atol=1e-7, err_msg=name)


def test_launcher_waits_for_all_and_stops_the_rest_when_one_fails() -> None:
    import subprocess
    import sys
    import time

    from euler_train.distributed import _wait_all

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    failing = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    start = time.monotonic()
    code = _wait_all([sleeper, failing])
    assert time.monotonic() - start < 30  # the sleeper was terminated, not waited for
    assert sleeper.returncode != 0 and code in (3, sleeper.returncode)
    ok = [subprocess.Popen([sys.executable, "-c", "pass"]) for _ in range(2)]
    assert _wait_all(ok) == 0


def test_shared_nccl_id_comes_from_the_launcher_environment(monkeypatch, tmp_path) -> None:
    from euler_train.distributed import shared_nccl_id

    monkeypatch.setenv("EULER_NCCL_ID", "[1, 2, 3]")
    assert shared_nccl_id(1, tmp_path) == (1, 2, 3)


def launch(rank: int, world: int, argv: list[str], port: str) -> subprocess.Popen:
    """One rank of a CPU world, as a torchrun-style launcher would start it."""
    env = dict(
        os.environ,
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        EULER_COMM="socket",
        MASTER_PORT=port,
    )
    return subprocess.Popen(
        [sys.executable, "-m", "euler_train.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_two_process_world_equals_one_process_with_twice_the_batch(tmp_path, dataset) -> None:
    from safetensors.numpy import load_file

    from euler_train.cli import main
    from euler_train.metrics import read_metrics

    common = [
        "pretrain",
        "--data",
        str(dataset),
        "--steps",
        "8",
        "--ckpt-every",
        "4",
        "--eval-every",
        "4",
        "--no-progress",
        "--set",
        "model.context=32",
    ]
    assert main([*common, "--out", str(tmp_path / "one"), "--batch-size", "4"]) == 0
    argv = [*common, "--out", str(tmp_path / "two"), "--batch-size", "2"]
    procs = [launch(r, 2, argv, "4711") for r in (1, 0)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "done: 8 steps" in outs[1][0] and "done" not in outs[0][0]  # only rank 0 reports
    one, two = (
        read_metrics(tmp_path / "one" / "metrics.jsonl"),
        read_metrics(tmp_path / "two" / "metrics.jsonl"),
    )
    assert [r["step"] for r in two] == list(range(1, 9))  # rank 0 alone wrote the metrics
    np.testing.assert_allclose([r["loss"] for r in two], [r["loss"] for r in one], rtol=1e-5)
    np.testing.assert_allclose(
        [r["val_loss"] for r in two if "val_loss" in r],
        [r["val_loss"] for r in one if "val_loss" in r],
        rtol=1e-5,
    )
    a = load_file(str(tmp_path / "one" / "checkpoints" / "step_8" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "checkpoints" / "step_8" / "model.safetensors"))
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)
    assert sorted(p.name for p in (tmp_path / "two" / "checkpoints").iterdir()) == ["step_4", "step_8"]


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_every_rank_at_the_same_step_and_resume_matches(tmp_path, dataset) -> None:
    import signal
    import time

    from safetensors.numpy import load_file

    from euler_train.checkpoint import CheckpointManager, read_state

    common = [
        "pretrain",
        "--data",
        str(dataset),
        "--steps",
        "90",
        "--ckpt-every",
        "10",
        "--eval-every",
        "0",
        "--no-progress",
        "--batch-size",
        "2",
        "--set",
        "model.context=32",
    ]
    ref = [  # the same two-rank run, uninterrupted
        launch(r, 2, [*common, "--out", str(tmp_path / "ref2")], "4712") for r in (0, 1)
    ]
    assert [p.communicate(timeout=120) and p.returncode for p in ref] == [0, 0]
    run = tmp_path / "run"
    procs = [launch(r, 2, [*common, "--out", str(run)], "4713") for r in (0, 1)]
    while not (run / "checkpoints" / "step_20").is_dir() and procs[0].poll() is None:
        time.sleep(0.01)
    procs[1].send_signal(signal.SIGTERM)  # only rank 1 is told; rank 0 learns it through the all-reduce
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [143, 143], outs
    stopped = read_state(CheckpointManager(run / "checkpoints").latest_valid())["step"]
    assert 20 <= stopped < 90
    procs = [launch(r, 2, [*common, "--out", str(run), "--resume"], "4714") for r in (0, 1)]
    assert [p.communicate(timeout=120) and p.returncode for p in procs] == [0, 0]
    a = load_file(str(tmp_path / "ref2" / "checkpoints" / "step_90" / "model.safetensors"))
    b = load_file(str(run / "checkpoints" / "step_90" / "model.safetensors"))
    for name in a:
        np.testing.assert_array_equal(b[name], a[name], err_msg=name)  # two ranks resume bitwise too


@pytest.mark.slow
def test_gpus_flag_spawns_workers_that_equal_one_process_and_stop_together(
    tmp_path, dataset, monkeypatch
) -> None:
    """`--gpus 2` itself (the launcher, worker sessions, signal forwarding), on CPU processes."""
    import signal
    import time

    from safetensors.numpy import load_file

    from euler_train.checkpoint import CheckpointManager, read_state
    from euler_train.cli import main

    common = [
        "pretrain",
        "--data",
        str(dataset),
        "--ckpt-every",
        "10",
        "--eval-every",
        "0",
        "--no-progress",
        "--set",
        "model.context=32",
    ]
    assert main([*common, "--out", str(tmp_path / "one"), "--steps", "10", "--batch-size", "4"]) == 0
    env = dict(os.environ, EULER_COMM="socket")
    argv = [*common, "--out", str(tmp_path / "two"), "--steps", "10", "--batch-size", "2", "--gpus", "2"]
    proc = subprocess.run(
        [sys.executable, "-m", "euler_train.cli", *argv], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "x 2 processes" in proc.stderr
    a = load_file(str(tmp_path / "one" / "checkpoints" / "step_10" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "checkpoints" / "step_10" / "model.safetensors"))
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)
    # a SIGTERM to the launcher reaches each worker once: both save-and-stop at one step, exit 143
    run = tmp_path / "stopped"
    argv = [*common, "--out", str(run), "--steps", "200", "--batch-size", "2", "--gpus", "2"]
    launcher = subprocess.Popen(
        [sys.executable, "-m", "euler_train.cli", *argv],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    while not (run / "checkpoints" / "step_20").is_dir() and launcher.poll() is None:
        time.sleep(0.01)
    launcher.send_signal(signal.SIGTERM)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 143, err
    assert err.count("SIGTERM received") == 2 and "Traceback" not in err and "KeyboardInterrupt" not in err
    stopped = read_state(CheckpointManager(run / "checkpoints").latest_valid())["step"]
    assert 20 <= stopped < 200
