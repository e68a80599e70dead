"""Decoders kept across calls on the GPU, so that a call pays for no setup that an earlier one has done.

A decoder (decode_batch.Decoder) holds a batch shape's inference weights, static state, captured step and
captured prefills. Making one costs a call many launches and a graph capture; a kept one is reused by the
next call of the same model, batch size, draft tree and sampling rule. Each call rewrites the kept weight
copies from params first, so a model updated in place (a trainer's step between two evaluations) is decoded
with its current weights.

The model is recognised by its params' arrays (names, device addresses, shapes, dtypes), its config and
the precision it is decoded in (euler_kernels.Precision): the captured graphs read those addresses and
were recorded with those kernels. Only the latest model's decoders are kept, at most KEPT_DECODERS of them,
least recently used dropped first; they share one set of weight copies (per number of drafting heads).
A decoder is lent to one decoding at a time: a call that finds its decoder busy (another generator still
streaming from it) gets a new decoder of its own, not kept.

Memory: a kept decoder holds its state (the static caches: n_layers x B x context x the kv width, twice)
and its graphs' temporaries (the largest recorded step or prefill), and the model's decoders share their
weight copies. A prefill that is not recorded allocates from CuPy's pool as any work does.
`release_kept_decoders()` frees them all (their device memory goes back to CuPy's pool).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any

import euler_kernels as ek
from euler_model.config import ModelConfig

KEPT_DECODERS = 4  # batch shapes (B, draft tree, sampling rule) kept for the latest model

_kept: OrderedDict[Hashable, Any] = OrderedDict()  # decoder key -> decoder, least recently used first
_weights: dict[int, dict] = {}  # drafting heads -> the inference weights the model's decoders share
_model: list[Hashable] = [None]  # the key of the model whose decoders are kept
_lock = threading.Lock()  # two threads must not be lent one decoder


def model_key(config: ModelConfig, params: dict[str, Any], precision: ek.Precision) -> Hashable:
    """What identifies a model to its kept decoders: its config, each array's name, address, shape and
    dtype, the GPU and the precision."""
    arrays = tuple((name, a.data.ptr, a.shape, a.dtype.str) for name, a in sorted(params.items()))
    return config, arrays, params["embed"].device.id, precision


def kept_decoder(
    config: ModelConfig,
    params: dict[str, Any],
    precision: ek.Precision,
    key: Hashable,
    make: Callable[[], Any],
) -> Any:
    """The kept decoder of this model under `key` (made by make() the first time), lent to the caller
    (its `busy` set until the decoding finishes); None when it is busy."""
    model = model_key(config, params, precision)
    with _lock:
        if model != _model[0]:
            _drop_all()
            _model[0] = model
        decoder = _kept.get(key)
        if decoder is not None and decoder.busy:
            return None
        if decoder is None:
            decoder = _kept[key] = make()
            while len(_kept) > KEPT_DECODERS:
                _kept.popitem(last=False)
        _kept.move_to_end(key)
        decoder.busy = True
        return decoder


def kept_weights(drafters: int, make: Callable[[], dict]) -> dict:
    """The inference weights (decode_step.inference_weights) with `drafters` drafting heads that the kept
    decoders of the current model share, made by make() the first time: one set of copies, not one a
    decoder (each decoder's call rewrites them from params before its steps read them)."""
    if drafters not in _weights:
        _weights[drafters] = make()
    return _weights[drafters]


def release_kept_decoders() -> None:
    """Drop every kept decoder and their weights (a decoding still streaming keeps its own until it ends)."""
    with _lock:
        _drop_all()


def _drop_all() -> None:
    _kept.clear()
    _weights.clear()
    _model[0] = None
