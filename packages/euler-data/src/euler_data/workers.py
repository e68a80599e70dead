"""The worker processes euler-bpe keeps between ``encode_batch`` calls (warm word caches): the encode
stages (``shards`` for pretraining, ``sft``) stop them when they are done."""

from __future__ import annotations

from euler_bpe import Tokenizer


def stop_workers(tok: Tokenizer) -> None:
    """Stop the worker processes euler-bpe keeps between ``encode_batch`` calls, if it keeps any."""
    close = getattr(tok, "close", None)
    if callable(close):
        close()
