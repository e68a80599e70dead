"""`euler-train dpo`: preference tuning from an SFT (or pretrain) checkpoint on a preference set, through the
command line: the reference scored once and kept in the checkpoints, the reward statistics in the metrics,
exact resume, and bad input as one line."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file

from euler_data.cli import main as euler_data
from tests.train.conftest import docstrings


@pytest.fixture(scope="module")
def prefs_data(tmp_path_factory, dataset):
    """The tiny run's dataset with a preference set: short questions, the chosen reply a phrase of the
    docstring, the rejected one a fixed refusal (a pattern a few steps can learn)."""
    root = tmp_path_factory.mktemp("prefs")
    data = shutil.copytree(dataset, root / "docs")
    records = [
        {"prompt": f"What does {name}?", "chosen": " ".join(doc.split()[:3]), "rejected": "No idea at all."}
        for name, doc in docstrings()
    ]
    (root / "pairs.json").write_text(json.dumps(records), encoding="utf-8")
    argv = ["prefs", "--source", str(root / "pairs.json"), "--out", str(data), "--context", "64"]
    assert euler_data([*argv, "--val-fraction", "0.2"]) == 0
    return data


def dpo(cli, data, init, out, *extra):
    return cli("dpo", "--data", str(data), "--init", str(init), "--out", str(out), "--no-progress", *extra)


def test_dpo_learns_the_preference_and_reports_it(cli, tmp_path, prefs_data, tiny_run):
    run = tmp_path / "dpo"
    done = dpo(cli, prefs_data, tiny_run, run, "--steps", "40", "--eval-every", "20", "--lr", "3e-3",
               "--set", "eval.batches=4", "--beta", "0.5")  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_reward_accuracy" in r]
    assert [r["step"] for r in evals] == [20, 40]
    last = evals[-1]
    assert last["train_reward_accuracy"] >= 0.9 and last["val_reward_accuracy"] >= 0.75
    assert (
        last["val_dpo_loss"] < np.log(2)
        and last["val_margin"] > 0
        and last["val_loss"] == last["val_dpo_loss"]
    )
    saved = load_file(str(run / "checkpoints" / "step_40" / "reference_logps.safetensors"))
    meta = json.loads((prefs_data / "prefs_meta.json").read_text())
    assert saved["train"].shape == (2 * meta["train"]["pairs"],) and saved["val"].shape == (
        2 * meta["val"]["pairs"],
    )
    state = json.loads((run / "checkpoints" / "step_40" / "trainer_state.json").read_text())
    assert state["mode"] == "dpo"
    report = (run / "report.md").read_text()
    assert "## Preferences" in report and "held-out reward accuracy" in report and "Preference set" in report
    assert "euler-train: done: 40 steps" in done.stdout


def test_dpo_resumes_exactly(cli, tmp_path, prefs_data, tiny_run):
    common = ("--lr", "3e-3", "--eval-every", "4", "--ckpt-every", "4")
    whole = dpo(cli, prefs_data, tiny_run, tmp_path / "whole", "--steps", "8", *common)
    assert whole.returncode == 0, whole.stderr
    half = dpo(cli, prefs_data, tiny_run, tmp_path / "half", "--steps", "4", *common)
    assert half.returncode == 0, half.stderr
    rest = dpo(cli, prefs_data, tiny_run, tmp_path / "half", "--steps", "8", "--resume", *common)
    assert rest.returncode == 0, rest.stderr
    a, b = (
        load_file(str(tmp_path / r / "checkpoints" / "step_8" / "model.safetensors"))
        for r in ("whole", "half")
    )
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_bad_dpo_input_is_one_line(cli, tmp_path, dataset, prefs_data, tiny_run):
    no_pairs = dpo(cli, dataset, tiny_run, tmp_path / "a", "--steps", "2")
    lines = no_pairs.stderr.strip().splitlines()
    assert no_pairs.returncode == 2 and len(lines) == 1 and "prefs_meta.json" in lines[0], no_pairs.stderr
    assert "euler-data prefs" in lines[0]
    no_init = cli("dpo", "--data", str(prefs_data), "--out", str(tmp_path / "b"), "--no-progress")
    assert no_init.returncode == 2 and "dpo needs --init" in no_init.stderr
    beta = dpo(cli, prefs_data, tiny_run, tmp_path / "c", "--beta", "0")
    assert beta.returncode == 2 and "train.dpo_beta must be > 0" in beta.stderr
    weight = dpo(cli, prefs_data, tiny_run, tmp_path / "d", "--sft-weight", "-1")
    assert weight.returncode == 2 and "train.dpo_sft_weight must be >= 0, got -1.0" in weight.stderr
    assert not (tmp_path / "d").exists()


def test_the_sft_weight_keeps_the_chosen_replies_likely(cli, tmp_path, prefs_data, tiny_run):
    """The same run with the chosen replies' NLL added (--sft-weight): the chosen replies end more likely
    than under DPO alone, and the run records the weight."""
    common = ("--steps", "12", "--eval-every", "12", "--lr", "3e-3", "--set", "eval.batches=4")
    chosen = {}
    for name, extra in (("plain", ()), ("weighted", ("--sft-weight", "1.0"))):
        done = dpo(cli, prefs_data, tiny_run, tmp_path / name, *common, *extra)
        assert done.returncode == 0, done.stderr
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        chosen[name] = [r for r in rows if "train_chosen_logp" in r][-1]["train_chosen_logp"]
    assert chosen["weighted"] > chosen["plain"]
    assert "dpo_sft_weight = 1.0" in (tmp_path / "weighted" / "config.toml").read_text()


def test_the_report_holds_the_chat_evaluation_before_and_after(cli, tmp_path, prefs_data, tiny_run):
    """A dpo run's report shows its own chat evaluation beside the starting run's, and greedy replies to
    the preference set's held-out prompts."""
    init = shutil.copytree(tiny_run, tmp_path / "init")
    chat_eval = ("chat", "--data", str(prefs_data), "--max-items", "2", "--max-new-tokens", "4")
    before = cli("eval", "--checkpoint", str(init), "--no-progress", *chat_eval)
    assert before.returncode == 0, before.stderr
    run = tmp_path / "dpo"
    assert dpo(cli, prefs_data, init, run, "--steps", "2", "--eval-every", "2").returncode == 0
    after = cli("eval", "--checkpoint", str(run), "--no-progress", *chat_eval)
    assert after.returncode == 0, after.stderr
    assert cli("report", str(run)).returncode == 0
    report = (run / "report.md").read_text()
    own, start = report.split("## Evaluations")[1].split("Before this run")
    assert "| chat | 2 |" in own and "| chat | 30 |" in start and str(init) in start
    assert f"(dpo from `{init}`)" in report
    assert "held-out prompts of the preference set" in report


# --- the GPU step (skipped without CUDA) -------------------------------------------------------------------
# the captured step needs the fused attention kernel: head_dim 64 (dim 128, 2 query heads, 1 kv head)
HEAD_DIM_64 = ("--set", "model.dim=128", "--set", "model.n_heads=2", "--set", "model.n_kv_heads=1")


@pytest.fixture(scope="module")
def gpu_init(tmp_path_factory, dataset, cli):
    """A 20-step head-dim-64 pretrain on the GPU (context 64): what the captured dpo step starts from."""
    run = tmp_path_factory.mktemp("gpu_init") / "run"
    argv = ("pretrain", "--data", str(dataset), "--out", str(run), "--steps", "20", "--eval-every", "20",
            "--no-progress", "--device", "gpu", "--set", "model.context=64")  # fmt: skip
    done = cli(*argv, "--set", "train.lr=1e-2", *HEAD_DIM_64)
    assert done.returncode == 0, done.stderr
    return run


def metric_rows(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.gpu
def test_the_captured_dpo_step_equals_the_eager_one(cli, tmp_path, prefs_data, gpu_init):
    """`dpo` on one GPU replays its step as a CUDA graph, and the graph computes what the eager step does:
    the losses, norms, held-out statistics and final weights of six steps."""
    common = ("--steps", "6", "--eval-every", "3", "--ckpt-every", "6", "--lr", "3e-3", "--beta", "0.5",
              "--device", "gpu", "--precision", "fp32", "--set", "eval.batches=2")  # fmt: skip
    graph = dpo(cli, prefs_data, gpu_init, tmp_path / "graph", *common, "--set", "train.cuda_graph=true")
    assert graph.returncode == 0, graph.stderr
    assert "captured as a CUDA graph" in graph.stderr
    eager = dpo(cli, prefs_data, gpu_init, tmp_path / "eager", *common, "--set", "train.cuda_graph=false")
    assert eager.returncode == 0 and "captured" not in eager.stderr, eager.stderr
    a, b = metric_rows(tmp_path / "eager"), metric_rows(tmp_path / "graph")
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose([r[key] for r in b], [r[key] for r in a], rtol=1e-4, err_msg=key)
    evals = [(x, y) for x, y in zip(a, b) if "val_margin" in x]
    assert len(evals) == 2
    for key in ("val_dpo_loss", "val_margin", "train_margin"):
        got, want = [y[key] for _, y in evals], [x[key] for x, _ in evals]
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4, err_msg=key)
    final = "checkpoints/step_6/model.safetensors"
    want, got = (load_file(str(tmp_path / r / final)) for r in ("eager", "graph"))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.gpu
def test_captured_bf16_dpo_follows_fp32_and_learns(cli, tmp_path, prefs_data, gpu_init):
    """The bf16 step (bf16 products and weight copies, captured) follows the fp32 run's losses within bf16's
    rounding, and its training pairs' reward accuracy rises as fp32's does."""
    common = ("--steps", "30", "--eval-every", "30", "--lr", "3e-3", "--beta", "0.5", "--device", "gpu",
              "--set", "eval.batches=4", "--set", "train.cuda_graph=true")  # fmt: skip
    runs = {}
    for precision in ("bf16", "fp32"):
        done = dpo(cli, prefs_data, gpu_init, tmp_path / precision, *common, "--precision", precision)
        assert done.returncode == 0, done.stderr
        assert "captured as a CUDA graph" in done.stderr
        runs[precision] = metric_rows(tmp_path / precision)
    bf16, fp32 = runs["bf16"], runs["fp32"]
    np.testing.assert_allclose([r["loss"] for r in bf16[:5]], [r["loss"] for r in fp32[:5]], rtol=3e-2)
    assert bf16[1]["loss"] != fp32[1]["loss"]  # the bf16 path really rounded something
    assert bf16[-1]["train_reward_accuracy"] >= 0.9 and fp32[-1]["train_reward_accuracy"] >= 0.9
