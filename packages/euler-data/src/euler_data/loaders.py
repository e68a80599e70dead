"""Batches for training, deterministic in (seed, step, rank): a resumed run sees the same batches.

Each call draws the *global* batch of ``batch_size * world_size`` rows from
``numpy.random.default_rng([seed, step])``; rank ``r`` keeps rows ``r::world_size``. So N ranks
together see exactly what one process with N times the batch would see, and no state is kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from euler_data.device import to_device
from euler_data.errors import DataError
from euler_data.meta import open_split, read_meta, split_paths
from euler_data.prefs import read_prefs
from euler_data.sft import read_sft


def _check_args(
    name: str, split: str, context: int, extra_targets: int, batch_size: int, rank, world
) -> None:
    if split not in ("train", "val"):
        raise ValueError(f"{name}: split must be 'train' or 'val', got {split!r}")
    if context < 1 or extra_targets < 1 or batch_size < 1:
        raise ValueError(
            f"{name}: context={context}, extra_targets={extra_targets}, batch_size={batch_size} must be >= 1"
        )
    if not 0 <= rank < world:
        raise ValueError(f"{name}: rank={rank} must be in [0, world_size={world})")


class PretrainLoader:
    """Random windows of ``context + extra_targets`` tokens from a split's token files (``train.bin`` /
    ``val.bin``, or shards): a window never crosses from one shard into the next.

    ``tokens = w[:T]`` and ``targets = w[1:]`` of each window ``w`` (MTP head k uses ``targets[:, k:k+T]``).

    >>> loader = PretrainLoader("data/tiny", context=128, extra_targets=4, batch_size=8)  # doctest: +SKIP
    >>> tokens, targets = loader.batch(0)  # doctest: +SKIP  (8, 128) and (8, 131) int64
    """

    def __init__(self, folder, split="train", context=128, extra_targets=1, batch_size=8, seed=0, rank=0,
                 world_size=1, device=None):  # fmt: skip
        _check_args("PretrainLoader", split, context, extra_targets, batch_size, rank, world_size)
        self.folder, self.split, self.device = Path(folder), split, device
        self.meta = read_meta(folder)
        self.shards = open_split(self.folder, split, self.meta)  # [(N_i,)], in order
        self.window = context + extra_targets
        self.context, self.batch_size, self.seed = context, batch_size, seed
        self.rank, self.world_size = rank, world_size
        # windows lie inside one shard: shard i has N_i - window + 1 starts (a single file: all of them)
        starts = np.array([max(len(d) - self.window + 1, 0) for d in self.shards], dtype=np.int64)
        self.first_start = np.concatenate([[0], np.cumsum(starts)])  # (shards + 1,)
        if self.first_start[-1] < 1:
            paths = split_paths(self.folder, split, self.meta)
            where = str(paths[0]) if len(paths) == 1 else f"{self.folder} ({split} shards)"
            raise DataError(where, f"{max(len(d) for d in self.shards)} tokens < one window of {self.window}")

    def starts(self, step: int) -> np.ndarray:
        """This rank's global window starts for ``step`` (over every shard's starts): (batch_size,) int64."""
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, self.first_start[-1], size=self.batch_size * self.world_size)
        return starts[self.rank :: self.world_size]

    def window_at(self, start: int) -> np.ndarray:
        """The (window,) tokens of global start ``start``."""
        shard = int(np.searchsorted(self.first_start, start, side="right")) - 1
        local = start - int(self.first_start[shard])
        return self.shards[shard][local : local + self.window]

    def batch(self, step: int):
        """(tokens (B, T) int64, targets (B, T + K - 1) int64) for ``step``."""
        windows = [self.window_at(int(s)) for s in self.starts(step)]
        rows = np.stack(windows).astype(np.int64)  # (B, T+K)
        return to_device(rows[:, : self.context], self.device), to_device(rows[:, 1:], self.device)


class SFTLoader:
    """SFT examples as rows of ``context + extra_targets`` tokens with a loss mask on the responses.

    Padded (default): one example per row, cut to the window, padded with ``<|endoftext|>`` (mask 0).
    Packed (``pack=True``): consecutive examples from a random one on, until the row is full.
    Returns ``(tokens (B, T), targets (B, T + K - 1), loss_mask (B, T + K - 1) float32)``.
    """

    def __init__(self, folder, split="train", context=128, extra_targets=1, batch_size=8, seed=0, rank=0,
                 world_size=1, pack=False, device=None):  # fmt: skip
        _check_args("SFTLoader", split, context, extra_targets, batch_size, rank, world_size)
        self.tokens, self.mask, self.offsets, self.meta = read_sft(folder, split)
        self.window, self.context = context + extra_targets, context
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size, self.pack, self.device = rank, world_size, pack, device
        self.pad = int(self.meta["eot_id"])
        if len(self.offsets) < 2:
            raise DataError(str(folder), f"SFT split {split!r} has no examples")

    def _row(self, first: int) -> tuple[np.ndarray, np.ndarray]:
        """One (window,) row of tokens and mask starting at example ``first``."""
        toks = np.full(self.window, self.pad, dtype=np.int64)
        mask = np.zeros(self.window, dtype=np.float32)
        filled, n, i = 0, len(self.offsets) - 1, first
        while filled < self.window:
            lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
            take = min(hi - lo, self.window - filled)
            toks[filled : filled + take] = self.tokens[lo : lo + take]
            mask[filled : filled + take] = self.mask[lo : lo + take]
            filled, i = filled + take, (i + 1) % n
            if not self.pack:
                break
        return toks, mask

    def batch(self, step: int):
        """(tokens (B, T) int64, targets (B, T + K - 1) int64, loss_mask (B, T + K - 1) float32)."""
        rng = np.random.default_rng([self.seed, step])
        firsts = rng.integers(0, len(self.offsets) - 1, size=self.batch_size * self.world_size)
        rows = [self._row(int(i)) for i in firsts[self.rank :: self.world_size]]
        toks = np.stack([r[0] for r in rows])  # (B, T+K)
        mask = np.stack([r[1] for r in rows])  # (B, T+K)
        out = toks[:, : self.context], toks[:, 1:], mask[:, 1:]
        return tuple(to_device(a, self.device) for a in out)


def pair_rows(pair_ids: np.ndarray) -> np.ndarray:
    """The rows of a preference set's pairs, in pair order: 2i (chosen), then 2i + 1 (rejected).

    >>> pair_rows(np.array([3, 0])).tolist()
    [6, 7, 0, 1]
    """
    return np.stack([2 * pair_ids, 2 * pair_ids + 1], axis=1).reshape(-1)


class PrefsLoader:
    """Preference pairs (a preference set: euler-data prefs) as 2P rows of ``context`` tokens: row 2i pair
    i's prompt and chosen reply, row 2i + 1 the same prompt and the rejected reply, each cut to the window
    (context + 1 tokens: the last target) and padded with ``<|endoftext|>`` (mask 0).

    ``batch(step)`` draws ``batch_size`` pairs a rank as the other loaders draw rows; ``pairs(first,
    count)`` gives pairs in order (an evaluation over a whole split). Both return ``(tokens (2P, T) int64,
    targets (2P, T) int64, mask (2P, T) float32, pair ids (P,) int64)``: the mask is 1 on the targets that
    are a reply's tokens; the ids index the split's pairs (a run's reference log-probabilities by pair).
    """

    def __init__(self, folder, split="train", context=128, batch_size=8, seed=0, rank=0, world_size=1,
                 device=None):  # fmt: skip
        _check_args("PrefsLoader", split, context, 1, batch_size, rank, world_size)
        self.tokens, self.mask, self.offsets, self.meta = read_prefs(folder, split)
        self.n_pairs = (len(self.offsets) - 1) // 2
        self.context, self.batch_size, self.seed = context, batch_size, seed
        self.rank, self.world_size, self.device = rank, world_size, device
        self.pad = int(self.meta["eot_id"])
        if self.n_pairs < 1:
            raise DataError(str(folder), f"preference split {split!r} has no pairs")

    def lengths(self) -> np.ndarray:
        """Each sequence's length in tokens (2 n_pairs,), row 2i chosen and 2i + 1 rejected."""
        return np.diff(self.offsets)

    def _rows(self, pair_ids: np.ndarray):
        window = self.context + 1
        toks = np.full((2 * len(pair_ids), window), self.pad, dtype=np.int64)
        mask = np.zeros((2 * len(pair_ids), window), dtype=np.float32)
        for row, seq in enumerate(pair_rows(pair_ids)):
            lo, hi = int(self.offsets[seq]), int(self.offsets[seq + 1])
            take = min(hi - lo, window)
            toks[row, :take] = self.tokens[lo : lo + take]
            mask[row, :take] = self.mask[lo : lo + take]
        out = toks[:, :-1], toks[:, 1:], mask[:, 1:], pair_ids.astype(np.int64)
        return tuple(to_device(a, self.device) for a in out)

    def batch(self, step: int):
        """This rank's pairs of ``step``: (tokens, targets, mask, pair ids), see the class docstring."""
        rng = np.random.default_rng([self.seed, step])
        ids = rng.integers(0, self.n_pairs, size=self.batch_size * self.world_size)
        return self._rows(ids[self.rank :: self.world_size])

    def pairs(self, first: int, count: int):
        """Pairs first .. first + count - 1 (fewer at the split's end), in order."""
        return self._rows(np.arange(first, min(first + count, self.n_pairs)))
