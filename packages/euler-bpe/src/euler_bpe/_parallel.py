"""encode_batch over several processes.

A forked worker uses the copy of the tokenizer it inherits; a spawned one rebuilds it once from its
plain state with the `rebuild` function the owner passes (either way the merges reach a worker once,
never per text). The pool stays alive
between calls, so the workers' word caches stay warm; it is closed by `Tokenizer.close()`, when the
tokenizer is garbage-collected, or at exit.
"""

from __future__ import annotations

import gc
import multiprocessing
import weakref
from array import array
from collections.abc import Callable, Sequence
from typing import Any

from euler_bpe._corpus import split_safely
from euler_bpe._pretokenize import GPT2_PATTERN
from euler_bpe._workers import leave_interrupts_to_parent

PIECE = 1 << 18  # characters: texts longer than this are cut into pieces of about this size
JOBS = 4  # jobs per worker: enough to even out the load, few enough that caches mostly stay apart

_WORKER: Any = None  # the tokenizer of this worker process
_FORKING: Any = None  # the tokenizer being forked: a forked worker finds it here, ready to use


def _init(state: dict, rebuild: Callable[[dict], Any]) -> None:
    global _WORKER
    leave_interrupts_to_parent()
    # Forked: the parent's tokenizer is already in memory. Spawned (or re-forked later): rebuild it.
    _WORKER = _FORKING if _FORKING is not None else rebuild(state)


def _encode_chunk(args: tuple[Sequence[str], Any, bool, str]) -> list[array]:
    texts, allowed, raw, typecode = args
    # An array travels back as raw bytes, much faster than a list of Python ints.
    return [_WORKER._encode_array(t, allowed, raw, typecode) for t in texts]


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


class WorkerPool:
    """A process pool whose workers each hold a copy of one tokenizer: `owner` itself when forked, else
    `rebuild(state)` (a module-level function, so that a spawned worker can import it)."""

    def __init__(self, owner: object, state: dict, rebuild: Callable[[dict], Any], workers: int):
        # Cutting texts is exact only for the GPT-2 pattern (see `_corpus.safe_cut`).
        self.cut = state["pattern"] == GPT2_PATTERN
        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self.workers = workers
        # Frozen objects are skipped by the workers' garbage collector, so forked workers do not
        # copy the parent's whole heap page by page.
        global _FORKING
        gc.freeze()
        _FORKING = owner
        try:
            context = multiprocessing.get_context(method)
            self.pool = context.Pool(workers, initializer=_init, initargs=(state, rebuild))
        finally:
            _FORKING = None
            gc.unfreeze()
        # terminate() runs when the owner is collected or at interpreter exit, whichever comes first
        self._finalizer = weakref.finalize(owner, self.pool.terminate)

    def encode(self, texts: Sequence[str], allowed: Any, raw: bool, typecode: str | None = None) -> list:
        """The ids of each text, in order: lists, or arrays of `typecode`. Long texts are cut where
        pretokenization splits anyway (so the ids are unchanged), to balance the work."""
        owner, pieces = [], []
        for i, text in enumerate(texts):
            for piece in split_safely(text, PIECE) if self.cut and len(text) > PIECE else [text]:
                owner.append(i)
                pieces.append(piece)
        jobs = [(chunk, allowed, raw, typecode or "I") for chunk in _chunks(pieces, self.workers * JOBS)]
        out: list[Any] = [None] * len(texts)
        for i, ids in zip(
            owner, (a for chunk in self.pool.map(_encode_chunk, jobs, chunksize=1) for a in chunk)
        ):
            ids = ids if typecode else ids.tolist()
            if out[i] is None:  # every text has at least one piece
                out[i] = ids
            else:
                out[i] += ids
        return out

    def close(self) -> None:
        self._finalizer()
