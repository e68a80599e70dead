"""The CLI surface: --help for every subcommand, and bad configs failing fast with the key named."""

from __future__ import annotations

import time

import pytest

from euler_train.args import build_parser
from euler_train.cli import main

SUBCOMMANDS = ["pretrain", "sft", "chat", "generate", "check", "export-hf", "plot", "quickstart"]


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_has_help(command, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"euler-train {command}" in out


def test_pretrain_flags_of_the_contract_exist() -> None:
    parser = build_parser()
    args = parser.parse_args(
        [
            "pretrain",
            "--data",
            "D",
            "--out",
            "R",
            "--preset",
            "small",
            "--device",
            "auto",
            "--steps",
            "3",
            "--batch-size",
            "2",
            "--ckpt-every",
            "1",
            "--eval-every",
            "1",
            "--seed",
            "4",
            "--resume",
            "--set",
            "train.lr=3e-4",
            "--set",
            "eval.batches=2",
        ]
    )
    assert (args.data, args.out, args.preset, args.device, args.steps, args.batch_size) == (
        "D",
        "R",
        "small",
        "auto",
        3,
        2,
    )
    assert args.resume and args.set == ["train.lr=3e-4", "eval.batches=2"]
    assert parser.parse_args(["sft", "--data", "D", "--init", "C", "--out", "R"]).init == "C"


def bad_cases(dataset, other_dataset, tiny_run):
    d = str(dataset)
    return [
        (["pretrain", "--data", d, "--set", "train.warmup=3"], "unknown key train.warmup"),
        (["pretrain", "--data", d, "--set", "train.batch_size=big"], "train.batch_size must be int"),
        (["pretrain", "--data", d, "--set", "model.n_heads=3"], "not divisible by n_heads=3"),
        (["pretrain", "--data", d, "--set", "model.vocab_size=100"], "model.vocab_size=100 is smaller"),
        (["pretrain", "--data", d, "--set", "model.n_hedz=2"], "unknown key model.n_hedz"),
        (["pretrain", "--data", d + "-missing"], "does not exist"),
        (["pretrain"], "data.dir is not set"),
        (["pretrain", "--data", d, "--precision", "tf32"], "run.precision='tf32' needs run.device=gpu"),
        (["pretrain", "--data", d, "--precision", "fp8"], "run.precision='fp8' needs run.device=gpu"),
        (["pretrain", "--data", d, "--set", 'train.fp8_scaling="delayed"'], "needs run.precision=fp8"),
        (["pretrain", "--data", d, "--set", "train.bf16_grads=true"], "train.bf16_grads needs bf16 or fp8"),
        (["sft", "--data", d], "data.init is not set"),
        (["sft", "--data", str(other_dataset), "--init", str(tiny_run)], "no sft_meta.json"),
    ]


@pytest.mark.slow
def test_bad_configs_fail_fast_with_the_key_named(tmp_path, dataset, other_dataset, tiny_run, cli) -> None:
    for argv, message in bad_cases(dataset, other_dataset, tiny_run):
        start = time.perf_counter()
        proc = cli(*argv, "--out", str(tmp_path / "run"))
        elapsed = time.perf_counter() - start
        assert proc.returncode == 2, (argv, proc.stderr)
        assert message in proc.stderr, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert elapsed < 3.0, f"{argv} took {elapsed:.2f} s (interpreter start included)"
        assert not (tmp_path / "run" / "checkpoints").exists()


def test_validation_itself_takes_well_under_a_second(tmp_path, dataset, capsys) -> None:
    start = time.perf_counter()
    code = main(["pretrain", "--data", str(dataset), "--out", str(tmp_path), "--set", "model.n_heads=3"])
    assert code == 2 and time.perf_counter() - start < 1.0
    assert "n_heads=3" in capsys.readouterr().err


def test_tokenizer_mismatch_between_checkpoint_and_dataset(tmp_path, other_dataset, tiny_run, capsys) -> None:
    # resuming tiny_run (vocab 320 tokenizer) on a dataset whose tokenizer differs
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    code = main(["pretrain", "--data", str(other_dataset), "--out", str(run), "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "tokenizer mismatch" in err


def test_sft_init_with_another_tokenizer_is_refused(tmp_path, dataset, other_dataset, capsys) -> None:
    run = tmp_path / "other"
    assert (
        main(["pretrain", "--data", str(other_dataset), "--out", str(run), "--steps", "2", "--no-progress"])
        == 0
    )
    code = main(["sft", "--data", str(dataset), "--init", str(run), "--out", str(tmp_path / "sft")])
    err = capsys.readouterr().err
    assert code == 2 and "tokenizer mismatch" in err and "data.init" in err


def test_bf16_on_the_cpu_is_a_clear_error(tmp_path, dataset, capsys) -> None:
    argv = [
        "pretrain",
        "--data",
        str(dataset),
        "--out",
        str(tmp_path),
        "--device",
        "cpu",
        "--precision",
        "bf16",
    ]
    assert main(argv) == 2
    assert "run.precision='bf16' needs run.device=gpu" in capsys.readouterr().err
    assert not (tmp_path / "checkpoints").exists()  # failed before any work


def test_gpu_without_cuda_is_a_clear_error(tmp_path, dataset, capsys) -> None:
    from euler_train.device import _cupy_or_none

    if _cupy_or_none() is not None:
        pytest.skip("a GPU is present")
    code = main(["pretrain", "--data", str(dataset), "--out", str(tmp_path), "--device", "gpu"])
    assert code == 2 and "--device gpu needs CuPy and a CUDA device" in capsys.readouterr().err


def test_resume_with_another_model_shape_names_the_keys(tmp_path, dataset, tiny_run, capsys) -> None:
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    (run / "config.toml").unlink()  # the checkpoint's own record (with config.toml: test_run_writers.py)
    code = main(
        ["pretrain", "--data", str(dataset), "--out", str(run), "--resume", "--set", "model.n_layers=3"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "model.n_layers: checkpoint 2, config 3" in err


def test_config_file_errors_name_the_file_and_key(tmp_path, dataset, capsys) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[train]\nlr = 1e-3\nwarmup = 10\n")
    assert main(["pretrain", "--data", str(dataset), "--out", str(tmp_path / "r"), "--config", str(bad)]) == 2
    assert "config file: unknown key train.warmup" in capsys.readouterr().err
    broken = tmp_path / "broken.toml"
    broken.write_text("[train\nlr = 1")
    assert (
        main(["pretrain", "--data", str(dataset), "--out", str(tmp_path / "r"), "--config", str(broken)]) == 2
    )
    assert str(broken) in capsys.readouterr().err


def test_a_config_file_sets_values_and_flags_override_it(tmp_path, dataset) -> None:
    good = tmp_path / "run.toml"
    good.write_text("[train]\nsteps = 3\nlr = 1e-3\n[eval]\nevery = 0\n[log]\nprogress = false\n")
    run = tmp_path / "r"
    assert (
        main(["pretrain", "--data", str(dataset), "--out", str(run), "--config", str(good), "--lr", "2e-3"])
        == 0
    )
    from euler_train.config import load_toml

    saved = load_toml(run / "config.toml")
    assert saved["train"]["steps"] == 3 and saved["train"]["lr"] == 2e-3 and saved["eval"]["every"] == 0
