"""The trainer's view of a dataset: train micro-batches by (step, micro), validation batches by index.

Both are pure functions of (seed, index, rank): a resumed run reads exactly the batches it would have
read, and rank r of N reads its own shard of the batch a single process with N x batch_size would read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import euler_data
from euler_data.dataset_folder import PREFS_META, SFT_META
from euler_train.config import ConfigError, RunConfig


@dataclass(frozen=True)
class TuningSet:
    """The set a tuning stage reads from its dataset folder: its record file, the command that makes it,
    and what its splits count."""

    record: str
    made_by: str
    unit: str


TUNING_SETS = {
    "sft": TuningSet(SFT_META, "euler-data sft", "examples"),
    "dpo": TuningSet(PREFS_META, "euler-data prefs", "pairs"),
}


def check_kind(folder: Path, mode: str) -> None:
    """ConfigError unless `folder` holds a pretrain set (train.bin, or the train shards meta.json lists), an
    SFT set (sft_meta.json) or a preference set (prefs_meta.json), as the mode asks."""
    if mode in TUNING_SETS:
        marker, made_by = TUNING_SETS[mode].record, TUNING_SETS[mode].made_by
        ok = (folder / marker).is_file()
    else:
        marker, made_by = "train.bin (or train shards in meta.json)", "euler-data prepare"
        ok = bool(split_files(folder, "train"))
    if not ok:
        raise ConfigError(f"data.dir {folder} has no {marker}: `{mode}` needs a folder made by `{made_by}`")


def split_files(folder: Path, split: str) -> list[Path]:
    """The token files of a pretrain split (euler-data's split_paths), [] when any of them is missing."""
    meta = euler_data.read_meta(folder) if (folder / "meta.json").is_file() else {}
    files = euler_data.split_paths(folder, split, meta)
    return files if all(f.is_file() for f in files) else []


def split_tokens(folder: Path, split: str) -> int:
    """Tokens in a pretrain split, from its files' sizes (uint16: 2 bytes a token)."""
    return sum(f.stat().st_size for f in split_files(folder, split)) // 2


def bytes_per_token(meta: dict[str, Any], split: str) -> float | None:
    """Bytes per token of a split from meta.json (for bits per byte), None when meta lacks the counts."""
    b, t = meta.get("bytes"), meta.get("tokens")  # euler-data: {"train": n, "val": n}
    if isinstance(b, dict) and isinstance(t, dict) and b.get(split) and t.get(split):
        return float(b[split]) / float(t[split])
    return None


def bits_per_byte(loss_nats: float, bytes_per_tok: float | None) -> float | None:
    """bpb = loss / ln 2 * tokens / bytes; None without the byte counts.

    >>> round(bits_per_byte(math.log(2), 1.0), 6)
    1.0
    """
    if bytes_per_tok is None or not math.isfinite(loss_nats):
        return None
    return loss_nats / math.log(2) / bytes_per_tok


@dataclass
class Batches:
    """Loader pair plus the counts needed for bits per byte; for dpo, the reference's log-probabilities."""

    train_loader: Any
    val_loader: Any | None
    grad_accum: int
    val_bytes_per_token: float | None
    refs: dict[str, np.ndarray] | None = None  # dpo: split -> the reference's log-prob of each row (2 a pair)

    def train(self, step: int, micro: int) -> tuple:
        """Micro-batch `micro` of optimizer step `step`: (tokens, targets, loss_mask or None), and for dpo
        the rows' reference log-probabilities (2P,) after them."""
        return self._micro(self.train_loader.batch(step * self.grad_accum + micro), "train")

    def val(self, index: int) -> tuple:
        """Validation batch `index`: random rows, or for dpo the val pairs index * B .. in order (fewer
        at the end, none past it)."""
        if self.refs is None:
            return _triple(self.val_loader.batch(index))
        b = self.val_loader.batch_size
        return self._micro(self.val_loader.pairs(index * b, b), "val")

    def _micro(self, batch: tuple, split: str) -> tuple:
        if self.refs is None:
            return _triple(batch)
        tokens, targets, mask, pairs = batch
        return (*_triple((tokens, targets, mask)), self.refs[split][euler_data.pair_rows(pairs)])


def _triple(batch: tuple) -> tuple[Any, Any, Any]:
    """(tokens, targets) or (tokens, targets, mask) as int64 tokens/targets and float32 mask or None."""
    tokens, targets = np.asarray(batch[0], dtype=np.int64), np.asarray(batch[1], dtype=np.int64)
    mask = np.asarray(batch[2], dtype=np.float32) if len(batch) > 2 and batch[2] is not None else None
    return tokens, targets, mask


def make_batches(cfg: RunConfig, mcfg: Any, kind: str, rank: int, world_size: int) -> Batches:
    """Build the train/val loaders of a pretrain, SFT or preference set for this rank."""
    folder = Path(cfg.data.dir)
    if kind == "dpo":  # pairs: batch_size pairs a micro-batch, rows of the context (head 0 alone scores)
        pairs = dict(context=mcfg.context, batch_size=cfg.train.batch_size, seed=cfg.train.seed, rank=rank,
                     world_size=world_size)  # fmt: skip
        train = euler_data.PrefsLoader(folder, split="train", **pairs)
        val = euler_data.PrefsLoader(folder, split="val", **pairs) if cfg.eval.enabled else None
        return Batches(train, val, cfg.train.grad_accum, None)
    common = dict(
        context=mcfg.context,
        extra_targets=mcfg.n_mtp_heads,  # windows of T + K tokens: targets (B, T + K - 1)
        batch_size=cfg.train.batch_size,
        seed=cfg.train.seed,
        rank=rank,
        world_size=world_size,
    )
    cls = euler_data.SFTLoader if kind == "sft" else euler_data.PretrainLoader
    train = cls(folder, split="train", **common)
    val = cls(folder, split="val", **common) if cfg.eval.enabled else None  # plan_run checked it
    bpt = bytes_per_token(euler_data.read_meta(folder), "val") if kind == "pretrain" else None
    return Batches(train, val, cfg.train.grad_accum, bpt)
