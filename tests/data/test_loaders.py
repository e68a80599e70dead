"""Loaders: shapes, windows from the data, determinism in (seed, step, rank), also in a fresh process."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from euler_data import PretrainLoader, SFTLoader, build_sft, read_meta


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tok):
    """A tiny dataset folder written directly: train.bin = 0..4999 mod 300, and a meta.json."""
    tmp_path = tmp_path_factory.mktemp("pretrain")
    data = (np.arange(5000) % 300).astype(np.uint16)
    data.tofile(tmp_path / "train.bin")
    data[:400].tofile(tmp_path / "val.bin")
    meta = {"tokens": {"train": 5000, "val": 400}, "eot_id": tok.special_tokens["<|endoftext|>"]}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    tok.save(tmp_path / "tokenizer.json")
    return tmp_path


def test_pretrain_batch_shapes_and_shifted_targets(folder):
    loader = PretrainLoader(folder, context=16, extra_targets=4, batch_size=3, seed=5)
    tokens, targets = loader.batch(0)
    assert tokens.shape == (3, 16) and targets.shape == (3, 19)
    assert tokens.dtype == np.int64 and targets.dtype == np.int64
    np.testing.assert_array_equal(tokens[:, 1:], targets[:, :15])  # head 0 predicts the next token
    data = np.fromfile(folder / "train.bin", dtype=np.uint16)
    for row, start in zip(tokens, loader.starts(0)):
        np.testing.assert_array_equal(row, data[start : start + 16])


@given(seed=st.integers(0, 2**32 - 1), step=st.integers(0, 10**9), world=st.integers(1, 4))
def test_ranks_split_the_global_batch(folder, seed, step, world):
    full = PretrainLoader(folder, context=8, extra_targets=2, batch_size=2 * world, seed=seed).batch(step)[0]
    for rank in range(world):
        part = PretrainLoader(folder, context=8, extra_targets=2, batch_size=2, seed=seed, rank=rank,
                              world_size=world).batch(step)[0]  # fmt: skip
        np.testing.assert_array_equal(part, full[rank::world])


def test_same_seed_and_step_give_the_same_batch_in_a_fresh_process(folder):
    code = (
        "import sys, numpy as np; from euler_data import PretrainLoader;"
        "t, y = PretrainLoader(sys.argv[1], context=32, extra_targets=3, batch_size=4, seed=11).batch(123);"
        "print(t.tolist(), y.tolist())"
    )
    here = PretrainLoader(folder, context=32, extra_targets=3, batch_size=4, seed=11).batch(123)
    argv = [sys.executable, "-c", code, str(folder)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"{here[0].tolist()} {here[1].tolist()}"
    other = PretrainLoader(folder, context=32, extra_targets=3, batch_size=4, seed=11).batch(124)
    assert not np.array_equal(here[0], other[0])


def test_bad_loader_arguments_are_clear_errors(folder):
    with pytest.raises(ValueError, match="PretrainLoader: rank=2 must be in"):
        PretrainLoader(folder, rank=2, world_size=2)
    with pytest.raises(ValueError, match="one window of 501"):
        PretrainLoader(folder, split="val", context=500, extra_targets=1)
    assert read_meta(folder)["tokens"]["train"] == 5000


@pytest.fixture
def sft_folder(tmp_path, tok):
    count = lambda i: " ".join(map(str, range(i)))  # noqa: E731
    records = [{"instruction": f"Count to {i}.", "output": count(i)} for i in range(2, 30)]
    (tmp_path / "s.json").write_text(json.dumps(records))
    build_sft([tmp_path / "s.json"], tmp_path, tok, context=200, val_fraction=0.0)
    return tmp_path


@pytest.mark.parametrize("pack", [False, True])
def test_sft_batches_mask_only_response_targets(sft_folder, tok, pack):
    loader = SFTLoader(sft_folder, context=40, extra_targets=2, batch_size=6, seed=3, pack=pack)
    tokens, targets, mask = loader.batch(9)
    assert tokens.shape == (6, 40) and targets.shape == mask.shape == (6, 41) and mask.dtype == np.float32
    np.testing.assert_array_equal(tokens[:, 1:], targets[:, :39])
    assistant = tok.special_tokens["<|assistant|>"]
    for row_t, row_m in zip(targets, mask):
        # a masked target is never a prompt token: the text before it in its turn holds <|assistant|>
        text = tok.decode([t for t, m in zip(row_t, row_m) if m])
        assert "<|user|>" not in text and "<|assistant|>" not in text
        assert row_m.any() or assistant not in row_t.tolist()
    again = SFTLoader(sft_folder, context=40, extra_targets=2, batch_size=6, seed=3, pack=pack).batch(9)
    for a, b in zip((tokens, targets, mask), again):
        np.testing.assert_array_equal(a, b)


def test_padded_rows_end_in_unmasked_padding(sft_folder, tok):
    _, targets, mask = SFTLoader(sft_folder, context=120, extra_targets=1, batch_size=4, seed=0).batch(0)
    eot = tok.special_tokens["<|endoftext|>"]
    for row_t, row_m in zip(targets, mask):
        last_end = max(i for i, t in enumerate(row_t) if t == tok.special_tokens["<|end|>"])
        assert row_m[last_end] == 1
        assert (row_t[last_end + 1 :] == eot).all() and (row_m[last_end + 1 :] == 0).all()


@pytest.mark.gpu
def test_cuda_batches_equal_the_numpy_batches(folder, sft_folder):
    import cupy

    host = PretrainLoader(folder, context=16, extra_targets=2, batch_size=4, seed=1).batch(3)
    dev = PretrainLoader(folder, context=16, extra_targets=2, batch_size=4, seed=1, device="cuda").batch(3)
    for h, d in zip(host, dev):
        assert isinstance(d, cupy.ndarray) and d.dtype == h.dtype
        np.testing.assert_array_equal(cupy.asnumpy(d), h)
    sft = SFTLoader(sft_folder, context=32, extra_targets=2, batch_size=3, seed=2, device="cuda").batch(0)
    assert sft[2].dtype == cupy.float32 and sft[0].shape == (3, 32)
