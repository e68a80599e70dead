"""chat, generate and export-hf from a trained checkpoint."""

from __future__ import annotations

import argparse
import io
import json

import numpy as np
import pytest

from euler_bpe import Tokenizer
from euler_train.chat import fit_history
from euler_train.cli import main
from euler_train.sampling import decode_stream, encode_prompt, load_for_sampling


@pytest.fixture(scope="module")
def tok(tiny_run) -> Tokenizer:
    return Tokenizer.load(tiny_run / "checkpoints" / "step_30" / "tokenizer.json")


def test_decode_stream_joins_split_characters_and_stops_at_a_stop_token(tok) -> None:
    ids = tok.encode("naïve café ok")
    pieces = list(
        decode_stream(
            tok,
            iter([*ids, tok.special_tokens["<|end|>"], *tok.encode("never")]),
            (tok.special_tokens["<|end|>"],),
        )
    )
    assert "".join(pieces) == "naïve café ok"
    assert all("\ufffd" not in p for p in pieces)


def test_fit_history_drops_the_oldest_turns_first(tok) -> None:
    history = []
    for i in range(6):
        history += [
            {"role": "user", "content": f"question number {i} about modules"},
            {"role": "assistant", "content": f"answer number {i} about functions"},
        ]
    history.append({"role": "user", "content": "last question"})
    full = encode_prompt(tok, history)
    budget = len(full) // 2
    ids = fit_history(tok, history, budget)
    assert len(ids) <= budget
    assert full[-len(ids) :] == ids  # a suffix: whole newest turns kept, oldest dropped
    assert tok.decode(ids).startswith("<|user|>") and "last question" in tok.decode(ids)


def chat_args(**kw) -> argparse.Namespace:
    base = dict(max_new_tokens=12, temperature=0.8, top_k=20, top_p=0.95, repetition_penalty=1.0, seed=1)
    return argparse.Namespace(**{**base, **kw})


def test_chat_repl_answers_resets_and_sets_temperature(tiny_run) -> None:
    from euler_train.chat import chat_repl

    model = load_for_sampling(str(tiny_run))
    script = io.StringIO("What does json do?\n/temp 0\nAnd re?\n/reset\n/bogus\nHello\n/quit\nnot read\n")
    out = io.StringIO()
    args = chat_args()
    assert chat_repl(model, args, script, out) == 0
    text = out.getvalue()
    assert text.count("assistant> ") == 3
    assert "(temperature 0.0)" in text and "(history cleared)" in text and "unknown command /bogus" in text
    assert args.temperature == 0.0
    assert "<|end|>" not in text and "<|assistant|>" not in text


def test_chat_command_reads_a_stdin_script(tiny_run, cli) -> None:
    proc = cli(
        "chat",
        "--checkpoint",
        str(tiny_run),
        "--max-new-tokens",
        "8",
        "--seed",
        "0",
        input="Hello there\n/reset\nBye\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("assistant> ") == 2


def test_generate_greedy_speculative_equals_plain(tiny_run, capsys) -> None:
    common = [
        "generate",
        "--checkpoint",
        str(tiny_run),
        "--prompt",
        "The module",
        "--max-new-tokens",
        "20",
        "--temperature",
        "0",
    ]
    assert main(common) == 0
    plain = capsys.readouterr().out
    assert main([*common, "--speculative"]) == 0
    assert capsys.readouterr().out == plain and len(plain) > 1  # 20 greedy tokens (maybe spaces)


def test_generate_sampling_is_reproducible_with_a_seed(tiny_run, capsys) -> None:
    argv = [
        "generate",
        "--checkpoint",
        str(tiny_run),
        "--prompt",
        "Return",
        "--max-new-tokens",
        "15",
        "--seed",
        "7",
        "--top-k",
        "30",
        "--top-p",
        "0.9",
        "--repetition-penalty",
        "1.2",
    ]
    main(argv)
    first = capsys.readouterr().out
    main(argv)
    assert capsys.readouterr().out == first


def test_export_hf_writes_a_llama_folder(tiny_run, tmp_path) -> None:
    out = tmp_path / "hf"
    assert main(["export-hf", "--checkpoint", str(tiny_run), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 2
    assert (out / "model.safetensors").stat().st_size > 0
    hf_tok = json.loads((out / "tokenizer.json").read_text())
    assert hf_tok["model"]["type"] == "BPE"


def test_sampling_from_a_corrupt_checkpoint_is_a_clear_error(tiny_run, tmp_path, capsys) -> None:
    import shutil

    ckpt = tmp_path / "step_30"
    shutil.copytree(tiny_run / "checkpoints" / "step_30", ckpt)
    (ckpt / "model.safetensors").write_bytes(b"\0" * 10)
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "x"]) == 2
    assert "unusable" in capsys.readouterr().err


def test_loaded_weights_equal_the_saved_ones(tiny_run) -> None:
    from safetensors.numpy import load_file

    model = load_for_sampling(str(tiny_run))
    saved = load_file(str(tiny_run / "checkpoints" / "step_30" / "model.safetensors"))
    for name, value in saved.items():
        np.testing.assert_array_equal(model.params[name], value)


def test_chat_through_a_pseudo_terminal(tiny_run) -> None:
    """Interactive use: a `you> ` prompt on a terminal, streamed answers, /quit ends the session."""
    import os
    import pty
    import select
    import subprocess
    import sys
    import time

    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "euler_train.cli",
            "chat",
            "--checkpoint",
            str(tiny_run),
            "--max-new-tokens",
            "6",
            "--seed",
            "0",
        ],
        stdin=slave,
        stdout=slave,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    os.close(slave)
    seen = b""

    def read_until(marker: bytes, count: int, timeout: float = 60) -> None:
        nonlocal seen
        deadline = time.monotonic() + timeout
        while seen.count(marker) < count and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
        assert seen.count(marker) >= count, seen

    try:
        read_until(b"you> ", 1)
        os.write(master, b"Hello\n")
        read_until(b"you> ", 2)
        os.write(master, b"/quit\n")
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert seen.count(b"assistant> ") == 1


def test_generate_edge_values_that_are_valid(tiny_run, capsys) -> None:
    """--top-k 0 means no top-k cut; an empty prompt samples from <|endoftext|>; the context's limits are
    said on stderr, not applied silently."""
    base = ["generate", "--checkpoint", str(tiny_run), "--seed", "1"]
    assert main([*base, "--prompt", "Return", "--max-new-tokens", "5", "--top-k", "0"]) == 0
    assert main([*base, "--prompt", "", "--max-new-tokens", "5"]) == 0
    capsys.readouterr()
    assert main([*base, "--prompt", "word " * 200, "--max-new-tokens", "500"]) == 0
    err = capsys.readouterr().err
    assert "only its last 63 fit the context (64)" in err and "room for 1 new tokens" in err
