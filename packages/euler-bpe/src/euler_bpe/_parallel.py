"""encode_batch over several processes: each worker rebuilds the tokenizer once from its plain state."""

from __future__ import annotations

import multiprocessing
from array import array
from collections.abc import Sequence
from typing import Any

_WORKER: Any = None  # the tokenizer of this worker process


def _init(state: dict) -> None:
    global _WORKER
    from euler_bpe._io import from_dict

    _WORKER = from_dict(state)


def _encode_chunk(args: tuple[Sequence[str], Any, bool]) -> list[array]:
    texts, allowed, raw = args
    # array('I') travels back as raw bytes, much faster than a list of Python ints.
    return [array("I", _WORKER._encode(t, allowed, raw)) for t in texts]


def _chunks(texts: Sequence[str], parts: int) -> list[Sequence[str]]:
    """Contiguous slices of about equal total length."""
    total = sum(map(len, texts)) or 1
    out, start, acc = [], 0, 0
    for i, t in enumerate(texts):
        acc += len(t)
        if acc * parts >= total * (len(out) + 1):
            out.append(texts[start : i + 1])
            start = i + 1
    if start < len(texts):
        out.append(texts[start:])
    return out


def encode_parallel(
    state: dict, texts: Sequence[str], allowed: Any, workers: int, raw: bool
) -> list[list[int]]:
    """Encode `texts` in `workers` processes; the order of the results is the order of `texts`."""
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    jobs = [(chunk, allowed, raw) for chunk in _chunks(texts, workers * 4)]
    with multiprocessing.get_context(method).Pool(workers, initializer=_init, initargs=(state,)) as pool:
        results = pool.map(_encode_chunk, jobs, chunksize=1)
    return [a.tolist() for chunk in results for a in chunk]
