"""GPU paths (skipped without CUDA): training on CuPy matches NumPy, NCCL bucketed all-reduce, MFU,
and -- with two or more GPUs -- `--gpus 2` equals one GPU with twice the batch."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load_file

import euler_model
from euler_kernels import Precision
from euler_train.cli import main
from euler_train.comm import Comm
from euler_train.config import resolve_config
from euler_train.graph_step import GraphStep
from euler_train.metrics import read_metrics
from euler_train.optimizer import AdamW
from euler_train.step import StepOptions

pytestmark = pytest.mark.gpu


def final(run, step):
    return load_file(str(run / "checkpoints" / f"step_{step}" / "model.safetensors"))


def assert_runs_match(ref, run, loss_rtol: float, rtol: float, atol: float) -> list[dict]:
    """run's per-step losses and final (step 6) weights equal ref's within the tolerances; run's metrics."""
    want, got = read_metrics(ref / "metrics.jsonl"), read_metrics(run / "metrics.jsonl")
    np.testing.assert_allclose([r["loss"] for r in got], [r["loss"] for r in want], rtol=loss_rtol)
    a, b = final(ref, 6), final(run, 6)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=rtol, atol=atol, err_msg=name)
    return got


def train(dataset, run, *extra):
    argv = [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(run),
        "--steps",
        "6",
        "--ckpt-every",
        "6",
        "--eval-every",
        "3",
        "--no-progress",
        "--set",
        "model.context=64",
        *extra,
    ]
    assert main(argv) == 0


def test_gpu_training_matches_cpu(tmp_path, dataset) -> None:
    train(dataset, tmp_path / "cpu", "--device", "cpu")
    train(dataset, tmp_path / "gpu", "--device", "gpu", "--precision", "fp32")
    gpu = assert_runs_match(tmp_path / "cpu", tmp_path / "gpu", 1e-4, 1e-3, 1e-5)
    assert all("mfu" in r and 0 < r["mfu"] < 1 for r in gpu)


# the captured step needs the fused attention kernel: head_dim 64 (dim 128, 2 query heads, 1 kv head)
HEAD_DIM_64 = ("--set", "model.dim=128", "--set", "model.n_heads=2", "--set", "model.n_kv_heads=1")


@pytest.mark.parametrize("accum", ["1", "2"])
def test_cuda_graph_step_equals_the_eager_step(tmp_path, dataset, capsys, accum) -> None:
    """The captured-and-replayed step (the default on one GPU) computes what the eager step computes."""
    common = ("--device", "gpu", "--precision", "fp32", "--set", f"train.grad_accum={accum}", *HEAD_DIM_64)
    train(dataset, tmp_path / "graph", *common)
    assert "captured as a CUDA graph" in capsys.readouterr().err  # the graph really ran
    train(dataset, tmp_path / "eager", *common, "--set", "train.cuda_graph=false")
    graph, eager = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("graph", "eager"))
    np.testing.assert_allclose([r["loss"] for r in graph], [r["loss"] for r in eager], rtol=1e-5)
    np.testing.assert_allclose([r["grad_norm"] for r in graph], [r["grad_norm"] for r in eager], rtol=1e-4)
    np.testing.assert_allclose(
        [r["val_loss"] for r in graph if "val_loss" in r],
        [r["val_loss"] for r in eager if "val_loss" in r],
        rtol=1e-5,
    )
    a, b = final(tmp_path / "eager", 6), final(tmp_path / "graph", 6)
    for name in a:
        np.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_cuda_graph_skips_non_finite_steps_on_the_device(tmp_path, dataset, capsys) -> None:
    """A learning rate that blows the loss up: the replayed step leaves the weights alone when the loss or
    the norm is not finite, and the trainer counts the skipped steps."""
    import json

    train(
        dataset,
        tmp_path / "blowup",
        "--device",
        "gpu",
        "--set",
        "train.lr=1e12",
        "--set",
        "train.warmup_steps=0",
        *HEAD_DIM_64,
        "--set",
        'train.on_nonfinite="skip"',
        "--set",
        "train.grad_clip=0",
    )
    assert "captured as a CUDA graph" in capsys.readouterr().err
    rows = read_metrics(tmp_path / "blowup" / "metrics.jsonl")
    state = json.loads((tmp_path / "blowup" / "checkpoints" / "step_6" / "trainer_state.json").read_text())
    assert state["skipped"] == sum(1 for r in rows if r.get("skipped")) > 0
    assert state["opt_t"] == 6 - state["skipped"]


def test_bf16_trains_like_fp32(tmp_path, dataset, capsys) -> None:
    """bf16 matmuls (float32 everything else) follow the fp32 run's losses within bf16's rounding, and
    the step is still captured as a CUDA graph."""
    train(dataset, tmp_path / "bf16", "--device", "gpu", "--precision", "bf16", *HEAD_DIM_64)
    assert "captured as a CUDA graph" in capsys.readouterr().err
    train(dataset, tmp_path / "fp32", "--device", "gpu", "--precision", "fp32", *HEAD_DIM_64)
    bf16, fp32 = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("bf16", "fp32"))
    np.testing.assert_allclose([r["loss"] for r in bf16], [r["loss"] for r in fp32], rtol=2e-2)
    assert bf16[-1]["loss"] != fp32[-1]["loss"]  # the bf16 path really rounded something


def captured_losses(matmul: str, steps: int = 6) -> list[float]:
    """The losses of `steps` captured training steps (GraphStep: a failed capture raises) of a head-dim-64
    model whose products are computed in euler_kernels.Precision(matmul), a new batch every step."""
    import cupy as cp

    cfg = euler_model.preset("tiny", dim=128, n_heads=2, n_kv_heads=1, context=64)
    params = {k: cp.asarray(v) for k, v in euler_model.init_params(cfg, seed=3).items()}
    t = resolve_config("tiny").train
    opt = AdamW(params, t.beta1, t.beta2, t.eps, 0.1)
    options = StepOptions(max_norm=1.0, precision=Precision(matmul))
    runner = GraphStep(cfg, params, opt, Comm(), options)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
        tokens = rng.integers(0, cfg.vocab_size, (4, 64))
        micro = [(tokens, rng.integers(0, cfg.vocab_size, (4, 64 + cfg.n_mtp_heads - 1)), None)]
        loss, _, applied = runner.run(micro, [1.0], opt.hyper(3e-3))
        assert applied
        opt.t += 1
        losses.append(loss)
    assert runner.graph is not None  # the steps really were replayed from a graph
    return losses


def test_bf16fast_steps_like_fp32() -> None:
    """bf16fast (float32 operands handed to cuBLAS, which down-converts them itself; float32 activations,
    TF32 attention), a comparison mode of the ops that euler-train's --precision does not offer: its
    captured steps follow the fp32 ones within bf16's rounding."""
    fast, fp32 = captured_losses("bf16fast"), captured_losses("fp32")
    np.testing.assert_allclose(fast, fp32, rtol=2e-2)
    assert fast[-1] != fp32[-1]  # cuBLAS really rounded something


def test_fp8_trains_like_bf16(tmp_path, dataset, capsys) -> None:
    """--precision fp8 (the MLP's and the heads' products in FP8) follows the bf16 run's losses within FP8's
    rounding, and the step is still captured as a CUDA graph."""
    train(dataset, tmp_path / "fp8", "--device", "gpu", "--precision", "fp8", *HEAD_DIM_64)
    assert "captured as a CUDA graph" in capsys.readouterr().err
    train(dataset, tmp_path / "bf16", "--device", "gpu", "--precision", "bf16", *HEAD_DIM_64)
    fp8, bf16 = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("fp8", "bf16"))
    np.testing.assert_allclose([r["loss"] for r in fp8], [r["loss"] for r in bf16], rtol=3e-2)
    assert fp8[-1]["loss"] != bf16[-1]["loss"]  # the FP8 products really ran


def test_an_fp8_run_resumes_where_it_stopped(tmp_path, dataset, capsys) -> None:
    """FP8 keeps no scaling state (each product's scales come from its operands' maxima), so a run resumed
    from its step-3 checkpoint takes the steps the uninterrupted run took, within the atomic adds' order."""
    import shutil

    flags = ("--device", "gpu", "--precision", "fp8", "--ckpt-every", "3", *HEAD_DIM_64)
    train(dataset, tmp_path / "ref", *flags)
    shutil.copytree(tmp_path / "ref", tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_6")
    train(dataset, tmp_path / "run", *flags, "--resume")
    assert "resuming at step 3" in capsys.readouterr().err
    assert_runs_match(tmp_path / "ref", tmp_path / "run", 1e-5, 1e-4, 1e-6)


DELAYED = ("--device", "gpu", "--precision", "fp8", "--set", 'train.fp8_scaling="delayed"', *HEAD_DIM_64)


def test_delayed_fp8_scales_train_like_current_ones_and_resume_exactly(tmp_path, dataset, capsys) -> None:
    """train.fp8_scaling = "delayed" (SwiGLU's outputs cast with their earlier steps' maxima) follows the
    current-scaling run's losses within FP8's rounding, the step is captured (the dry run measured the
    first maxima), each checkpoint holds the scales, and a run resumed from its step-3 checkpoint takes the
    uninterrupted run's steps."""
    import shutil

    flags = (*DELAYED, "--ckpt-every", "3")
    train(dataset, tmp_path / "ref", *flags)
    assert "captured as a CUDA graph" in capsys.readouterr().err
    assert (tmp_path / "ref" / "checkpoints" / "step_3" / "fp8_scales.safetensors").is_file()
    train(dataset, tmp_path / "current", "--device", "gpu", "--precision", "fp8", *HEAD_DIM_64)
    delayed, current = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("ref", "current"))
    np.testing.assert_allclose([r["loss"] for r in delayed], [r["loss"] for r in current], rtol=3e-2)
    shutil.copytree(tmp_path / "ref", tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "checkpoints" / "step_6")
    train(dataset, tmp_path / "run", *flags, "--resume")
    assert "resuming at step 3" in capsys.readouterr().err
    assert_runs_match(tmp_path / "ref", tmp_path / "run", 1e-5, 1e-4, 1e-6)


def test_tf32_runs(tmp_path, dataset) -> None:
    train(dataset, tmp_path / "tf32", "--device", "gpu", "--precision", "tf32")
    assert (tmp_path / "tf32" / "checkpoints" / "step_6").is_dir()


def test_nccl_bucketed_allreduce_on_one_rank_is_the_identity(monkeypatch) -> None:
    import cupy
    from cupy.cuda import nccl

    from euler_train import distributed

    monkeypatch.setattr(distributed, "BUCKET_BYTES", 256)  # many small buckets
    comm = distributed.NcclComm(0, 1, 0, nccl.get_unique_id())
    rng = np.random.default_rng(0)
    shapes = [(3, 5), (7,), (16, 16), (2, 3, 4), (1,), (40,)]
    host = {f"p{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    grads = {k: cupy.asarray(v) for k, v in host.items()}
    comm.allreduce_grads(grads)
    comm.allreduce_grads(grads)  # the persistent buffers are reused
    for k, v in host.items():
        np.testing.assert_array_equal(grads[k].get(), v)
    assert comm.allreduce_scalars([1.5, -2.0]) == [1.5, -2.0]
    comm.close()


def test_two_gpus_equal_one_gpu_with_twice_the_batch(tmp_path, dataset) -> None:
    import cupy

    if cupy.cuda.runtime.getDeviceCount() < 2:
        pytest.skip("needs two GPUs")
    train(dataset, tmp_path / "one", "--device", "gpu", "--gpus", "1", "--batch-size", "4")
    train(dataset, tmp_path / "two", "--device", "gpu", "--gpus", "2", "--batch-size", "2")
    assert_runs_match(tmp_path / "one", tmp_path / "two", 1e-5, 1e-4, 1e-6)


def test_muon_captured_equals_muon_eager_and_its_cpu_run(tmp_path, dataset, capsys) -> None:
    """--optimizer muon: the CUDA graph of the step (bf16 Newton-Schulz on cuBLAS) computes what the eager
    GPU step computes; both follow the CPU run (float32 Newton-Schulz) within bf16's rounding."""
    common = ("--optimizer", "muon", *HEAD_DIM_64)
    train(dataset, tmp_path / "graph", "--device", "gpu", "--precision", "fp32", *common)
    assert "captured as a CUDA graph" in capsys.readouterr().err
    train(dataset, tmp_path / "eager", "--device", "gpu", *common, "--set", "train.cuda_graph=false")
    eager, graph = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("eager", "graph"))
    np.testing.assert_allclose([r["loss"] for r in graph], [r["loss"] for r in eager], rtol=1e-4)
    # bf16 Newton-Schulz: a rounding that flips under another cuBLAS algorithm (capture picks its own) is
    # amplified by the iteration's polynomial, so single elements differ by a few lr * 2**-8 (seen: 1e-3
    # on 1% of a matrix's elements); each matrix as a whole agrees
    a, b = final(tmp_path / "eager", 6), final(tmp_path / "graph", 6)
    for name in a:
        assert np.linalg.norm(b[name] - a[name]) < 5e-2 * np.linalg.norm(a[name]), name
    train(dataset, tmp_path / "cpu", "--device", "cpu", *common)
    cpu, gpu = (read_metrics(tmp_path / r / "metrics.jsonl") for r in ("cpu", "graph"))
    np.testing.assert_allclose([r["loss"] for r in gpu], [r["loss"] for r in cpu], rtol=2e-2)
