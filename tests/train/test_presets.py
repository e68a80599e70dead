"""The `350m`, `1b` and `3b` presets, the memory check refusing them where they do not fit, and
`train.recompute` / `--recompute` through the CLI."""

from __future__ import annotations

import resource
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import euler_model
from euler_kernels import Precision
from euler_train import memory_check
from euler_train.args import build_parser
from euler_train.cli import main
from euler_train.comm import Comm
from euler_train.config import ConfigError, resolve_config
from euler_train.graph_step import GraphStep
from euler_train.metrics import read_metrics
from euler_train.optimizer import make_optimizer
from euler_train.runspec import config_from_args
from euler_train.step import EagerStep, StepOptions

# dim, q / kv heads, head size, layers, ffn, vocab, K, context
SHAPES = {
    "350m": (1024, 16, 4, 64, 24, 2816, 32768, 1, 1024),
    "1b": (2048, 16, 4, 128, 16, 5632, 32768, 1, 1024),
    "3b": (3072, 24, 8, 128, 24, 8192, 32768, 1, 2048),
}


def expected_params(dim, hq, hkv, d, layers, ffn, vocab, k) -> int:
    """Embedding, per layer q/k/v/o + gate/up/down + two norms, final norm, K heads."""
    attn = dim * hq * d + 2 * dim * hkv * d + hq * d * dim
    return vocab * dim + layers * (attn + 3 * dim * ffn + 2 * dim) + dim + k * vocab * dim


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_presets_have_the_issues_shapes_and_parameter_counts(name) -> None:
    dim, hq, hkv, d, layers, ffn, vocab, k, context = SHAPES[name]
    cfg = euler_model.preset(name)
    got = (cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.n_layers, cfg.ffn_dim)
    assert got == (dim, hq, hkv, d, layers, ffn)
    assert (cfg.vocab_size, cfg.n_mtp_heads, cfg.context) == (vocab, k, context)
    count = euler_model.count_params(cfg)
    assert count == expected_params(dim, hq, hkv, d, layers, ffn, vocab, k)
    assert round(count / 1e6) == {"350m": 338, "1b": 856, "3b": 2617}[name]
    run = resolve_config(name)
    assert run.model["preset"] == name
    assert (run.run.device, run.run.precision) == ("gpu", "bf16")
    assert run.train.min_lr < run.train.lr <= 3e-4


def test_the_cli_lists_and_takes_the_presets(cli) -> None:
    proc = cli("pretrain", "--help")
    assert proc.returncode == 0
    assert "350m" in proc.stdout and "1b" in proc.stdout
    args = build_parser().parse_args(["pretrain", "--out", "R", "--preset", "1b"])
    assert config_from_args(args).model["preset"] == "1b"
    proc = cli("pretrain", "--out", "R", "--preset", "2b")
    assert proc.returncode == 2 and "350m" in proc.stderr and "Traceback" not in proc.stderr


def limit_address_space(gib: float):
    """A preexec_fn: the child may map at most `gib` GiB (ulimit -v)."""

    def apply() -> None:
        limit = int(gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    return apply


def snapshot(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="reads /proc/self/statm")
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_memory_check_refuses_a_preset_that_does_not_fit_before_any_work(
    name, tmp_path, dataset, cli, monkeypatch
) -> None:
    """A process limited to 4 GiB of address space cannot hold either model's weights, gradients and
    AdamW moments: one line with the GiB, exit 2, no run folder."""
    run = tmp_path / "run"
    args = ["pretrain", "--preset", name, "--data", str(dataset), "--out", str(run), "--no-progress"]
    args += ["--device", "cpu", "--precision", "fp32"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # BLAS's per-thread buffers stay out of the 4 GiB
    proc = cli(*args, preexec_fn=limit_address_space(4))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = lines[0]
    assert "ulimit -v" in line and "GiB" in line and "batch size 1 does not fit either" in line, line
    need = float(line.split("needs about ")[1].split(" GiB")[0])
    # the dataset's 320-token vocabulary replaces the preset's, as with every preset
    cfg = euler_model.preset(name, vocab_size=320)
    est = euler_model.step_memory(cfg, resolve_config(name).train.batch_size)
    assert need == pytest.approx(est["total"] / 2**30, abs=0.05)
    assert need > 4
    assert snapshot(run) == []


class FakeHost:
    kind = "cpu"


# setting -> (run.precision, overrides of the 350m preset, the value with which it fits, step_memory's
# arguments as configured and with that value, the refusal's suggestion)
SUGGESTIONS = {
    "recompute": (
        "fp32",
        [],
        True,
        {},
        {"recompute": True},
        r"set train.recompute=true \(--recompute: it fits then\)",
    ),
    "keep_activations": (
        "bf16",
        [],
        False,
        {"activation_bytes": 2, "keep_activations": True, "bf16_grads": True},
        {"activation_bytes": 2, "bf16_grads": True},
        r"set train.keep_activations=false \(it fits then\)",
    ),
    "bf16_grads": (
        "bf16",
        ["train.bf16_grads=false"],
        True,
        {"activation_bytes": 2, "keep_activations": True},
        {"activation_bytes": 2, "keep_activations": True, "bf16_grads": True},
        r"set train.bf16_grads=true \(it fits then\)",
    ),
}


@pytest.mark.parametrize("key", sorted(SUGGESTIONS))
def test_the_refusal_suggests_the_setting_with_which_it_would_fit(key, monkeypatch) -> None:
    precision, overrides, value, as_set, changed, suggestion = SUGGESTIONS[key]
    device = "cpu" if precision == "fp32" else "gpu"
    run = [f"run.device='{device}'", f"run.precision='{precision}'", *overrides]
    cfg = resolve_config("350m", overrides=run)
    assert getattr(cfg.train, key) is not value  # the preset's own setting, or the override's
    mcfg = euler_model.preset("350m")
    need = euler_model.step_memory(mcfg, 16, **as_set)["total"]
    fits = euler_model.step_memory(mcfg, 16, **changed)["total"]
    assert fits < need
    have = (fits + need) // 2
    monkeypatch.setattr(memory_check, "available_bytes", lambda device: (have, "available host memory"))
    with pytest.raises(ConfigError, match=suggestion):
        memory_check.check_memory(cfg, mcfg, FakeHost())
    setattr(cfg.train, key, value)
    assert memory_check.check_memory(cfg, mcfg, FakeHost())["total"] == fits


def test_the_large_presets_keep_their_activations_unless_told_not_to() -> None:
    for name in ("350m", "1b", "3b"):
        assert resolve_config(name).train.keep_activations is True
        off = resolve_config(name, overrides=["train.keep_activations=false"])
        assert off.train.keep_activations is False
    with pytest.raises(ConfigError, match=r"train\.keep_activations must be bool"):
        resolve_config("tiny", overrides=["train.keep_activations='yes'"])


def test_the_bf16_presets_take_bf16_weight_gradients_unless_told_not_to() -> None:
    for name in ("350m", "1b", "3b"):
        assert resolve_config(name).train.bf16_grads is True
        assert resolve_config(name, overrides=["train.bf16_grads=false"]).train.bf16_grads is False
    assert resolve_config("gpu").train.bf16_grads is False  # TF32 products: float32 gradients
    # the preset's default gives way to the run's own choices; an explicit setting is checked
    for run in (["run.precision='tf32'"], ["train.optimizer='muon'"], ["run.gpus=2"]):
        assert resolve_config("1b", overrides=run).train.bf16_grads is False, run
    on_cpu = resolve_config("1b", flags={"run.precision": "fp32", "run.device": "cpu"})
    assert on_cpu.train.bf16_grads is False
    with pytest.raises(ConfigError, match=r"train\.bf16_grads needs bf16 or fp8 products"):
        resolve_config("350m", overrides=["train.bf16_grads=true"], flags={"run.precision": "tf32"})


def test_recompute_flag_and_key_are_the_same_setting() -> None:
    parser = build_parser()
    flag = config_from_args(parser.parse_args(["pretrain", "--out", "R", "--recompute"]))
    key = config_from_args(parser.parse_args(["pretrain", "--out", "R", "--set", "train.recompute=true"]))
    off = config_from_args(parser.parse_args(["pretrain", "--out", "R"]))
    assert flag.train.recompute is key.train.recompute is True
    assert off.train.recompute is False
    with pytest.raises(ConfigError, match=r"train\.recompute must be bool"):
        resolve_config("tiny", overrides=["train.recompute=1"])


def test_a_run_with_recompute_is_bitwise_the_run_without(tmp_path, dataset) -> None:
    """Losses of every step and the final weights and moments equal the run that keeps its activations
    (the CPU, float32, two micro-batches, clipping and evaluation included)."""
    common = ["pretrain", "--data", str(dataset), "--steps", "6", "--eval-every", "3", "--grad-accum", "2"]
    common += ["--no-progress", "--set", "model.context=48", "--set", "train.lr=1e-2"]
    runs = {}
    for label, extra in (("kept", []), ("rerun", ["--recompute"])):
        runs[label] = tmp_path / label
        assert main([*common, "--out", str(runs[label]), *extra]) == 0
    assert "recompute = true" in (runs["rerun"] / "config.toml").read_text()
    kept, rerun = (read_metrics(runs[k] / "metrics.jsonl") for k in ("kept", "rerun"))
    assert [r["loss"] for r in rerun] == [r["loss"] for r in kept]
    assert [r.get("val_loss") for r in rerun] == [r.get("val_loss") for r in kept]
    assert kept[-1]["loss"] < kept[0]["loss"]  # the run trains
    for file in ("model.safetensors", "optimizer.safetensors"):
        a, b = (load_file(str(runs[k] / "checkpoints/step_6" / file)) for k in ("kept", "rerun"))
        assert sorted(a) == sorted(b)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=f"{file}: {name}")


@pytest.mark.gpu
def test_the_captured_step_with_recompute_trains_like_the_one_without() -> None:
    """One GPU, bf16 activations: the step with recompute is captured as a CUDA graph, its first loss is
    the same number (the same forward), later losses agree, and its weights differ from the captured run
    without by no more than an eager run without differs from that captured one (the atomics in the
    attention and norm backward sum in any order; AdamW turns a gradient's noise into a full-size step
    where the gradient is near zero, so element-wise tolerances would judge noise), and its graph's pool
    holds less memory. The spread is taken against an eager run because two captured runs can happen to
    sum in the same order (2.5e-7 apart on an H200, where eager vs captured and eager vs eager: 7.6e-3)."""
    cp = pytest.importorskip("cupy")
    cfg = euler_model.preset("gpu", n_layers=4, context=256)
    base = euler_model.init_params(cfg, seed=0, xp=cp)
    rng = np.random.default_rng(0)
    micro = [(rng.integers(0, cfg.vocab_size, (8, 256)), rng.integers(0, cfg.vocab_size, (8, 259)), None)]
    out = []
    for captured, recompute in ((True, False), (False, False), (True, True)):
        params = {k: v.copy() for k, v in base.items()}
        opt = make_optimizer(params, resolve_config("gpu").train)
        options = StepOptions(max_norm=1.0, recompute=recompute, precision=Precision("bf16"))
        step = (GraphStep if captured else EagerStep)(cfg, params, opt, Comm(), options)
        losses = []
        for _ in range(4):
            loss, _, applied = step.run(micro, [1.0], opt.hyper(3e-4))
            assert applied
            opt.t += 1
            losses.append(loss)
        assert not captured or step.graph is not None
        # the pool also holds the step's gradients, the same with or without recompute: compare the rest
        memory = step.memory_bytes() - sum(g.nbytes for g in step.buf.grads.values()) if captured else None
        out.append((losses, {k: cp.asnumpy(v) for k, v in params.items()}, memory))
    (kept, w_kept, mem_kept), (_, w_eager, _), (rerun, w_rerun, mem_rerun) = out
    assert rerun[0] == kept[0]
    np.testing.assert_allclose(rerun, kept, rtol=1e-3)
    w0 = {k: cp.asnumpy(v) for k, v in base.items()}

    def distance(a: dict, b: dict) -> float:
        return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - b[k]) ** 2) for k in a)))

    moved, spread, apart = distance(w_kept, w0), distance(w_eager, w_kept), distance(w_rerun, w_kept)
    print(f"weights moved {moved:.3e}; eager vs captured without {spread:.3e}; with vs without {apart:.3e}")
    assert apart <= 3 * spread + 1e-3 * moved, (apart, spread, moved)
    assert mem_rerun < 0.8 * mem_kept, (mem_rerun, mem_kept)


def test_the_3b_step_fits_an_80_gib_gpu_at_its_batch_and_the_check_says_what_to_lower_below() -> None:
    """The memory check's estimate of the `3b` step (bf16, kept activations, bf16 weight gradients, batch
    4 x 2048): under an H100's 78 GiB; with 56 GiB it names the settings that make it fit."""

    class Gpu:
        kind, index, name = "gpu", 0, "fake"

    cfg = resolve_config("3b")
    mcfg = euler_model.preset("3b")
    need = memory_check._estimate(mcfg, cfg.train.batch_size, cfg.train, "bf16")
    assert 60 * 2**30 < need["total"] < 78 * 2**30
    original = memory_check.available_bytes
    try:
        memory_check.available_bytes = lambda device: (56 * 2**30, "GPU 0 memory (fake)")
        with pytest.raises(ConfigError) as refused:
            memory_check.check_memory(cfg, mcfg, Gpu())
        assert "set train.recompute=true (--recompute: it fits then) or lower train.batch_size to 2" in str(
            refused.value
        )
    finally:
        memory_check.available_bytes = original
