"""--optimizer muon in the trainer: Muon state in checkpoints, exact resume after kill -9 on the CPU, and
a clear refusal to resume a run under the other optimizer."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import load_file

from euler_train.checkpoint import CheckpointManager, read_state
from euler_train.cli import main
from euler_train.metrics import read_metrics

FLAGS = ["--optimizer", "muon", "--steps", "40", "--ckpt-every", "4", "--eval-every", "20", "--no-progress"]
FLAGS += ["--set", "checkpoint.keep_last=20"]


def test_muon_trains_checkpoints_its_state_and_resumes_bit_identically(tmp_path, dataset, capsys) -> None:
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert main(["pretrain", "--data", str(dataset), "--out", str(ref), *FLAGS]) == 0
    rows = read_metrics(ref / "metrics.jsonl")
    assert np.mean([r["loss"] for r in rows[-5:]]) < np.mean([r["loss"] for r in rows[:5]]) - 0.3
    opt = load_file(str(ref / "checkpoints" / "step_40" / "optimizer.safetensors"))
    assert any(k.startswith("muon.layers.") for k in opt) and "m.embed" in opt and "m.layers.0.wq" not in opt
    assert read_state(ref / "checkpoints" / "step_40")["optimizer"] == "muon"
    cmd = [sys.executable, "-m", "euler_train.cli", "pretrain", "--data", str(dataset), "--out", str(run)]
    proc = subprocess.Popen([*cmd, *FLAGS], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (run / "checkpoints" / "step_12").is_dir() and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.kill()
    proc.wait()
    assert read_state(CheckpointManager(run / "checkpoints").latest_valid())["step"] < 40
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume", *FLAGS]) == 0
    for name in ("model.safetensors", "optimizer.safetensors"):
        a, b = (load_file(str(r / "checkpoints" / "step_40" / name)) for r in (ref, run))
        assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a), name
    assert [r["loss"] for r in read_metrics(run / "metrics.jsonl")] == [r["loss"] for r in rows]
    capsys.readouterr()
    adamw = [f if f != "muon" else "adamw" for f in FLAGS]
    assert main(["pretrain", "--data", str(dataset), "--out", str(ref), "--resume", *adamw]) == 2
    assert "train.optimizer='muon'" in capsys.readouterr().err


def test_the_cpu_update_spread_over_worker_threads_is_the_one_call_update() -> None:
    """Muon.update on NumPy splits the matrices across the step's worker threads (BLAS at one thread):
    every weight and momentum buffer is bitwise what one muon_update call over all of them gives."""
    import euler_model
    from euler_kernels import muon_update
    from euler_model.cpu_threads import _controller
    from euler_train.config import resolve_config
    from euler_train.optimizer import Muon, balanced_parts

    cfg = euler_model.preset("small")
    params = euler_model.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    grads = {n: rng.standard_normal(p.shape).astype(p.dtype) for n, p in params.items()}
    opt = Muon({n: p.copy() for n, p in params.items()}, resolve_config("small").train)
    spread = {n: p.copy() for n, p in params.items()}
    hyper = opt.hyper(2e-3)
    control = np.array([0.8, 1.0, *hyper[:3], 1.0], np.float32)  # grad scale, apply, lr, bc1, bc2, norm
    assert len(balanced_parts([spread[n].shape for n in opt.names], 2)) == 2
    opt.update(spread, grads, control, hyper)
    one = {n: params[n].copy() for n in opt.names}
    bufs = [np.zeros_like(one[n]) for n in opt.names]
    with _controller()[0].limit(limits=1):
        muon_update([one[n] for n in opt.names], bufs, [grads[n] for n in opt.names], control, hyper,
                    Muon.LR_SLOT, momentum=opt.momentum, weight_decay=opt.weight_decay)  # fmt: skip
    for n, b in zip(opt.names, bufs):
        assert np.array_equal(spread[n], one[n]) and np.array_equal(opt.bufs[n], b), n
    assert not np.array_equal(spread[opt.names[0]], params[opt.names[0]])  # the update did move them
