"""Training runs on the CPU: loss falls, run folder contract, exact resume after kill -9 / SIGTERM /
a truncated checkpoint, non-finite guards, SFT on response tokens only."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from euler_train.args import build_parser
from euler_train.checkpoint import CheckpointManager, read_state
from euler_train.cli import main
from euler_train.metrics import read_metrics

# a tiny pretrain long enough to interrupt: 120 steps, checkpoints every 10
LONG = [
    "--steps",
    "120",
    "--ckpt-every",
    "10",
    "--eval-every",
    "40",
    "--no-progress",
    "--set",
    "checkpoint.keep_last=20",
]


def long_run_cmd(dataset: Path, run: Path) -> list[str]:
    """The LONG pretrain as a subprocess command line (to be killed or signalled mid-run)."""
    cli = [sys.executable, "-m", "euler_train.cli"]
    return [*cli, "pretrain", "--data", str(dataset), "--out", str(run), *LONG]


def weights(run: Path, step: int) -> dict[str, np.ndarray]:
    return load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))


def assert_same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, dataset) -> Path:
    """The uninterrupted run every resume is compared with."""
    run = tmp_path_factory.mktemp("ref") / "run"
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), *LONG]) == 0
    return run


def test_pretrain_writes_the_run_folder_and_loss_falls(tiny_run) -> None:
    rows = read_metrics(tiny_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 31))
    first, last = np.mean([r["loss"] for r in rows[:5]]), np.mean([r["loss"] for r in rows[-5:]])
    assert last < first - 0.3, (first, last)
    vals = [r for r in rows if "val_loss" in r]
    assert [r["step"] for r in vals] == [10, 20, 30] and vals[-1]["val_loss"] < vals[0]["val_loss"]
    assert all(0 < r["val_bpb"] < 8 for r in vals)
    assert (tiny_run / "config.toml").read_text().count("[train]") == 1
    assert (tiny_run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    ckpt = tiny_run / "checkpoints" / "step_30"
    assert {
        "model.safetensors",
        "optimizer.safetensors",
        "trainer_state.json",
        "checksums.sha256",
        "tokenizer.json",
    } <= {p.name for p in ckpt.iterdir()}
    state = read_state(ckpt)
    assert state["step"] == 30 and state["opt_t"] == 30 and state["tokens"] == 30 * 4 * 64


def test_bits_per_byte_follows_from_the_next_token_loss(tiny_run, dataset) -> None:
    meta = json.loads((dataset / "meta.json").read_text())
    row = [r for r in read_metrics(tiny_run / "metrics.jsonl") if "val_bpb" in r][-1]
    want = row["val_next_loss"] / np.log(2) * meta["tokens"]["val"] / meta["bytes"]["val"]
    assert row["val_bpb"] == pytest.approx(want, rel=1e-12)


@pytest.mark.slow
def test_kill_9_then_resume_is_bitwise_identical(tmp_path, dataset, reference_run) -> None:
    run = tmp_path / "run"
    cmd = long_run_cmd(dataset, run)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rng = np.random.default_rng()
    target = run / "checkpoints" / f"step_{int(rng.integers(2, 8)) * 10}"  # a random checkpoint step
    deadline = time.monotonic() + 60
    while not target.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(float(rng.uniform(0, 0.05)))  # and a random step after it
    proc.kill()
    proc.wait()
    newest = CheckpointManager(run / "checkpoints").latest_valid()
    assert newest is not None and read_state(newest)["step"] < 120, "the run was not interrupted"
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume", *LONG]) == 0
    assert_same_weights(weights(run, 120), weights(reference_run, 120))
    assert (
        load_file(str(run / "checkpoints/step_120/optimizer.safetensors")).keys()
        == load_file(str(reference_run / "checkpoints/step_120/optimizer.safetensors")).keys()
    )
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 121))  # no duplicated or missing steps
    ref = read_metrics(reference_run / "metrics.jsonl")
    assert [r["loss"] for r in rows] == [r["loss"] for r in ref]


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, dataset, reference_run, signum) -> None:
    run = tmp_path / "run"
    cmd = long_run_cmd(dataset, run)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not (run / "checkpoints" / "step_20").is_dir() and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    assert f"{signal.Signals(signum).name} received" in err and "--resume" in err and "Traceback" not in err
    stopped = read_state(CheckpointManager(run / "checkpoints").latest_valid())["step"]
    assert 20 <= stopped < 120 and (run / "checkpoints" / f"step_{stopped}").is_dir()
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume", *LONG]) == 0
    assert_same_weights(weights(run, 120), weights(reference_run, 120))


def test_truncated_checkpoint_falls_back_to_the_previous_and_still_matches(
    tmp_path, dataset, reference_run, capsys
) -> None:
    import shutil

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    for step in (30, 40):  # pretend the run died at 40 while its newest checkpoint got truncated
        shutil.copytree(reference_run / "checkpoints" / f"step_{step}", run / "checkpoints" / f"step_{step}")
    shutil.copy(reference_run / "config.toml", run / "config.toml")
    model = run / "checkpoints" / "step_40" / "model.safetensors"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume", *LONG]) == 0
    err = capsys.readouterr().err
    assert "step_40 is unusable" in err and "truncated or corrupt" in err
    assert_same_weights(weights(run, 120), weights(reference_run, 120))


def test_resume_when_every_checkpoint_is_corrupt_is_a_clear_error(
    tmp_path, dataset, tiny_run, capsys
) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    for folder in (run / "checkpoints").iterdir():
        (folder / "trainer_state.json").write_text("{}")
    assert main(["pretrain", "--data", str(dataset), "--out", str(run), "--resume"]) == 2
    assert "no valid checkpoint" in capsys.readouterr().err


def nan_at(step_to_break: int, monkeypatch) -> None:
    """Make the training step's loss NaN on the given (1-based) optimizer step."""
    import euler_model

    real = euler_model.loss_and_grads_on_device
    calls = {"n": 0}

    def patched(*args, **kwargs):
        calls["n"] += 1
        loss, grads = real(*args, **kwargs)
        return (loss * np.float32("nan"), grads) if calls["n"] == step_to_break else (loss, grads)

    monkeypatch.setattr(euler_model, "loss_and_grads_on_device", patched)


def test_non_finite_loss_stops_without_touching_good_checkpoints(
    tmp_path, dataset, monkeypatch, capsys
) -> None:
    nan_at(15, monkeypatch)
    run = tmp_path / "run"
    code = main(
        [
            "pretrain",
            "--data",
            str(dataset),
            "--out",
            str(run),
            "--steps",
            "30",
            "--ckpt-every",
            "5",
            "--no-progress",
        ]
    )
    assert code == 3
    err = capsys.readouterr().err
    assert "non-finite loss at step 15" in err and "train.on_nonfinite" in err
    assert [p.name for p in CheckpointManager(run / "checkpoints").folders()] == ["step_10", "step_5"]


def test_non_finite_loss_can_skip_the_step(tmp_path, dataset, monkeypatch) -> None:
    nan_at(4, monkeypatch)
    run = tmp_path / "run"
    code = main(
        [
            "pretrain",
            "--data",
            str(dataset),
            "--out",
            str(run),
            "--steps",
            "8",
            "--no-progress",
            "--set",
            'train.on_nonfinite="skip"',
        ]
    )
    assert code == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert [r.get("skipped", False) for r in rows] == [False] * 3 + [True] + [False] * 4
    state = read_state(CheckpointManager(run / "checkpoints").latest_valid())
    assert state["skipped"] == 1 and state["opt_t"] == 7


@pytest.mark.slow
def test_sft_trains_on_responses_from_a_pretrained_checkpoint(tmp_path, dataset, tiny_run) -> None:
    run = tmp_path / "sft"
    code = main(
        [
            "sft",
            "--data",
            str(dataset),
            "--init",
            str(tiny_run),
            "--out",
            str(run),
            "--steps",
            "25",
            "--eval-every",
            "25",
            "--no-progress",
            "--set",
            "train.lr=3e-3",
        ]
    )
    assert code == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert np.mean([r["loss"] for r in rows[-5:]]) < np.mean([r["loss"] for r in rows[:5]])
    state = read_state(CheckpointManager(run / "checkpoints").latest_valid())
    assert state["mode"] == "sft" and state["model_config"]["context"] == 64


def test_sft_loss_ignores_prompt_tokens(tmp_path, dataset, tiny_run) -> None:
    """Changing a masked-out (prompt) target leaves the SFT step's loss and gradient unchanged."""
    from euler_train.config import DeviceConfig
    from euler_train.device import setup_device
    from euler_train.distributed import Comm
    from euler_train.runspec import config_from_args, plan_run
    from euler_train.trainer import Trainer

    args = build_parser().parse_args(
        ["sft", "--data", str(dataset), "--init", str(tiny_run), "--out", str(tmp_path / "r")]
    )
    spec = plan_run(config_from_args(args), args.out, "sft")
    trainer = Trainer(spec, setup_device(DeviceConfig()), Comm())
    trainer.setup()
    _, _, mask = trainer.batches.train(0, 0)
    assert 0 < mask.sum() < mask.size
    loss_a, grads_a = trainer.gradients(0)
    original = trainer.batches.train

    def altered(step, micro):
        t, y, m = original(step, micro)
        y = np.where(m > 0, y, (y + 1) % spec.mcfg.vocab_size)  # every prompt/pad target changes
        return t, y, m

    trainer.batches.train = altered
    loss_b, grads_b = trainer.gradients(0)
    assert loss_a == loss_b
    for name in grads_a:
        np.testing.assert_array_equal(grads_a[name], grads_b[name])


def test_progress_and_plot_commands(tmp_path, tiny_run, capsys) -> None:
    out = tmp_path / "curve.png"
    assert main(["plot", str(tiny_run), "--out", str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG"


def test_check_command_passes(capsys) -> None:
    assert main(["check", "--quick"]) == 0
    out = capsys.readouterr().out
    for op in (
        "embedding",
        "rmsnorm",
        "linear",
        "rope",
        "attention",
        "swiglu",
        "residual",
        "cross_entropy",
        "model (tiny)",
    ):
        assert op in out
    assert "all gradients OK" in out and "FAIL" not in out


def test_non_finite_weights_are_never_checkpointed(tmp_path, dataset, capsys) -> None:
    from euler_train.config import DeviceConfig, resolve_config
    from euler_train.device import setup_device
    from euler_train.distributed import Comm
    from euler_train.runspec import plan_run
    from euler_train.trainer import Trainer

    cfg = resolve_config("tiny", overrides=[f'data.dir="{dataset}"'])
    trainer = Trainer(plan_run(cfg, tmp_path / "run", "pretrain"), setup_device(DeviceConfig()), Comm())
    trainer.setup()
    trainer.save()
    good = (tmp_path / "run" / "checkpoints" / "step_0" / "model.safetensors").read_bytes()
    trainer.params["norm"][0] = np.inf
    trainer.save()
    assert "not finite; not saving" in capsys.readouterr().err
    assert (tmp_path / "run" / "checkpoints" / "step_0" / "model.safetensors").read_bytes() == good


def test_gradient_accumulation_averages_the_micro_batches(tmp_path, dataset) -> None:
    import euler_model
    from euler_train.config import DeviceConfig, resolve_config
    from euler_train.device import setup_device
    from euler_train.distributed import Comm
    from euler_train.runspec import plan_run
    from euler_train.trainer import Trainer

    cfg = resolve_config(
        "tiny", overrides=[f'data.dir="{dataset}"', "train.grad_accum=3", "train.batch_size=2"]
    )
    trainer = Trainer(plan_run(cfg, tmp_path / "run", "pretrain"), setup_device(DeviceConfig()), Comm())
    trainer.setup()
    micro = [trainer.batches.train(5, i) for i in range(3)]
    assert not np.array_equal(micro[0][0], micro[1][0])  # three different micro-batches
    by_hand = [euler_model.loss_and_grads(trainer.spec.mcfg, trainer.params, t, y) for t, y, _ in micro]
    before = {n: p.copy() for n, p in trainer.params.items()}
    loss, grads = trainer.gradients(5)
    assert all(np.array_equal(before[n], p) for n, p in trainer.params.items())  # nothing updated
    assert trainer.micro_weights(micro) == [2 * trainer.spec.mcfg.context] * 3
    assert loss == pytest.approx(np.mean([lo for lo, _ in by_hand]), rel=1e-6)
    for name in grads:
        np.testing.assert_allclose(
            grads[name], np.mean([g[name] for _, g in by_hand], axis=0), rtol=1e-5, atol=1e-8, err_msg=name
        )


def test_a_dataset_without_validation_split_is_refused_unless_no_eval(tmp_path, corpus, capsys) -> None:
    from euler_data.cli import main as euler_data

    data = tmp_path / "data"
    argv = [
        "prepare",
        "--source",
        f"{corpus}::paragraph",
        "--vocab-size",
        "300",
        "--min-chars",
        "40",
        "--val-fraction",
        "0",
        "--out",
        str(data),
        "--quiet",
        "--workers",
        "1",
    ]
    assert euler_data(argv) == 0
    run = tmp_path / "run"
    argv = ["pretrain", "--data", str(data), "--out", str(run), "--steps", "4", "--eval-every", "2"]
    assert main([*argv, "--no-progress"]) == 2
    assert "the val split holds 0 tokens" in capsys.readouterr().err and not run.exists()
    assert main([*argv, "--no-progress", "--no-eval"]) == 0
    rows = read_metrics(run / "metrics.jsonl")
    assert len(rows) == 4 and not any("val_loss" in r for r in rows)


def test_sft_records_the_init_model_resumes_and_refuses_a_new_shape(
    tmp_path, dataset, tiny_run, capsys
) -> None:
    from euler_train.config import load_toml

    run = tmp_path / "sft"
    base = ["sft", "--data", str(dataset), "--init", str(tiny_run), "--out", str(run), "--no-progress"]
    assert main([*base, "--steps", "4", "--ckpt-every", "2"]) == 0
    saved = load_toml(run / "config.toml")["model"]
    assert saved["context"] == 64 and saved["n_layers"] == 2  # the shape of data.init, recorded
    assert main([*base, "--steps", "6", "--ckpt-every", "2", "--resume"]) == 0
    assert "resuming at step 4" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 7))
    assert main([*base, "--steps", "2", "--set", "model.n_layers=5"]) == 2
    assert "model.n_layers=5 (data.init has 2)" in capsys.readouterr().err
