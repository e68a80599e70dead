"""benchmarks/torch_twin.py is the same run as `euler-train pretrain`, only in PyTorch.

Tiny Shakespeare (the mirror) -> euler-data prepare (BPE, vocab 512) -> `euler-train pretrain` with
the `small` preset (context 64) for 20 steps (gradient accumulation, clipping that engages, warmup then
cosine, two evaluations) and the twin with the same flags on the CPU in fp32. If the config resolution,
initial weights, batch order, schedule, AdamW or evaluation differed, the losses would part at once;
they agree to float32 rounding. Then `euler-train plot A B --labels` overlays and compares them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from euler_train.cli import main
from tests.conftest import REPO_ROOT
from tests.e2e.test_pipeline import run

pytestmark = [pytest.mark.data, pytest.mark.slow]

FLAGS = (
    "--preset small --steps 20 --eval-every 10 --set model.context=64 --set train.batch_size=8 "
    "--set train.grad_accum=2 --set train.warmup_steps=5 --set train.grad_clip=0.5 --set eval.batches=4 "
    "--set log.every=1"
).split()


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def shakespeare(tmp_path: Path, mirror: Path) -> Path:
    """Tiny Shakespeare prepared with a 512-token vocabulary (the mirror's)."""
    data = tmp_path / "data"
    prepare = ["prepare", "--source", "tinyshakespeare", "--mirror", str(mirror), "--vocab-size", "512"]
    run("euler-data", *prepare, "--out", str(data), "--quiet")
    return data


def twin(data: Path, out: Path, precision: str, *extra: str) -> subprocess.CompletedProcess:
    """The twin on one CPU thread, FLAGS' run (and `extra` flags) in `precision`; it must succeed."""
    script = [
        sys.executable,
        str(REPO_ROOT / "benchmarks" / "torch_twin.py"),
        "--device",
        "cpu",
        "--threads",
        "1",
    ]
    argv = [*script, "--precision", precision, "--data", str(data), "--out", str(out), *FLAGS, *extra]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def test_the_torch_twin_reproduces_an_euler_pretrain_run(tmp_path, mirror, capsys) -> None:
    pytest.importorskip("torch")
    data, ours, twin_run = shakespeare(tmp_path, mirror), tmp_path / "euler", tmp_path / "torch"
    run("euler-train", "pretrain", "--data", str(data), "--out", str(ours), "--no-progress", *FLAGS)
    proc = twin(data, twin_run, "fp32")
    assert "torch_twin: done: 20 steps, 20,480 tokens" in proc.stdout

    a, b = rows(ours), rows(twin_run)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, 21))
    assert [set(r) for r in a] == [set(r) for r in b]  # the same row format, evaluations at the same steps
    assert [r["lr"] for r in a] == [r["lr"] for r in b]  # the same schedule, to the bit
    assert any(r["grad_norm"] > 0.5 for r in a)  # clipping engaged at least once
    # float32 rounding alone leaves ~1e-6; the bounds are tight enough to catch a real difference: weight
    # decay on the norms too moves the losses by 4e-4, eps 1e-6 by 2e-3, the schedule one step late by 1e-2
    rel = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)]
    assert rel[0] < 1e-5, f"step 1: same weights and batch, losses {a[0]['loss']} vs {b[0]['loss']}"
    assert abs(a[0]["grad_norm"] - b[0]["grad_norm"]) < 1e-5 * a[0]["grad_norm"]
    assert max(rel) < 2e-5, f"per-step relative loss differences: {rel}"
    assert a[-1]["loss"] < a[0]["loss"] - 0.5  # and it trained
    evals = [(x["val_bpb"], y["val_bpb"]) for x, y in zip(a, b) if "val_bpb" in x]
    assert len(evals) == 2
    assert all(abs(x - y) < 1e-4 for x, y in evals), evals  # issue 10 asks for 0.02 at the end of the GPU run
    assert abs(a[-1]["val_loss"] - b[-1]["val_loss"]) < 1e-5 * a[-1]["val_loss"]

    assert main(["plot", str(ours), str(twin_run), "--labels", "euler,pytorch"]) == 0
    assert "val bpb at the end: pytorch - euler = " in capsys.readouterr().out
    assert (ours / "compare.png").read_bytes()[:4] == b"\x89PNG"


def test_the_torch_twin_with_torch_optim_muon_follows_euler_muon(tmp_path, mirror) -> None:
    """--optimizer muon on both sides (ours: float32 Newton-Schulz on the CPU; torch.optim.Muon: bf16):
    the same first step, then curves within bf16's rounding of each other, both training."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.optim, "Muon"):
        pytest.skip("torch.optim.Muon needs PyTorch >= 2.9")
    data, ours, twin_run = shakespeare(tmp_path, mirror), tmp_path / "euler", tmp_path / "torch"
    run("euler-train", "pretrain", "--data", str(data), "--out", str(ours), "--no-progress", *FLAGS,
        "--optimizer", "muon")  # fmt: skip
    twin(data, twin_run, "fp32", "--optimizer", "muon")
    a, b = rows(ours), rows(twin_run)
    rel = [abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(a, b)]
    assert rel[0] < 1e-5 and max(rel) < 1e-2, rel
    assert a[-1]["loss"] < a[0]["loss"] - 0.5 and b[-1]["loss"] < b[0]["loss"] - 0.5


def test_the_torch_twin_in_bf16_autocast_trains_like_its_fp32_run(tmp_path, mirror) -> None:
    """--precision bf16 (torch.autocast to bfloat16, on the CPU here): the losses follow the fp32 twin's
    within bf16's rounding, and differ from them (the products really were bf16)."""
    pytest.importorskip("torch")
    data = shakespeare(tmp_path, mirror)
    runs = {}
    for precision in ("fp32", "bf16"):
        twin(data, tmp_path / precision, precision)
        runs[precision] = rows(tmp_path / precision)
    fp32, bf16 = ([r["loss"] for r in runs[p]] for p in ("fp32", "bf16"))
    assert max(abs(a - b) / a for a, b in zip(fp32, bf16)) < 3e-2
    assert fp32 != bf16
    assert bf16[-1] < bf16[0] - 0.5  # it trained
