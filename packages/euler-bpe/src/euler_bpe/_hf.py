"""Hugging Face `tokenizer.json` (the `tokenizers` library) for byte-level BPE: import and export.

Supported: a BPE model with no normalizer, pretokenized by ByteLevel (the GPT-2 pattern) or by a
Split on another pattern followed by ByteLevel without its regex. Special tokens are `added_tokens`.
"""

from __future__ import annotations

import json
import os
from typing import Any

from euler_bpe._bytes import bytes_to_chars
from euler_bpe._gpt2 import build_from_strings, read_merge_lines
from euler_bpe._io import read_json
from euler_bpe._pretokenize import GPT2_PATTERN
from euler_bpe._vocab import Vocab, make_vocab
from euler_bpe.errors import TokenizerFileError


def _byte_level(use_regex: bool) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": use_regex}


def _pre_tokenizer(pattern: str) -> dict[str, Any]:
    if pattern == GPT2_PATTERN:
        return _byte_level(True)
    split = {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}
    return {"type": "Sequence", "pretokenizers": [split, _byte_level(False)]}


def _pattern_of(pre: Any) -> str:
    """The pretokenization pattern a supported pre_tokenizer stands for; else TokenizerFileError.

    >>> _pattern_of(_pre_tokenizer("[a-z]+| ")), _pattern_of(_pre_tokenizer(GPT2_PATTERN)) == GPT2_PATTERN
    ('[a-z]+| ', True)
    """
    if isinstance(pre, dict) and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space"):
        if pre.get("use_regex", True):
            return GPT2_PATTERN
    if isinstance(pre, dict) and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 2:
        split, level = pre["pretokenizers"]
        regex = split.get("pattern", {}).get("Regex") if split.get("type") == "Split" else None
        ok = split.get("behavior") == "Isolated" and not split.get("invert")
        if regex and ok and level.get("type") == "ByteLevel" and not level.get("use_regex", True):
            return regex
    raise TokenizerFileError(f"from_hf: unsupported pre_tokenizer {json.dumps(pre)[:200]} (need ByteLevel)")


def _check_model(model: Any) -> None:
    if not isinstance(model, dict) or model.get("type", "BPE") != "BPE":
        raise TokenizerFileError("from_hf: the model is not BPE")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("dropout"):
        raise TokenizerFileError("from_hf: subword prefixes/suffixes and dropout are not supported")
    if model.get("byte_fallback") or model.get("ignore_merges"):
        raise TokenizerFileError("from_hf: byte_fallback and ignore_merges are not supported")
    if not isinstance(model.get("vocab"), dict) or not isinstance(model.get("merges"), list):
        raise TokenizerFileError("from_hf: model.vocab (dict) or model.merges (list) is missing")


def is_hf_json(data: Any) -> bool:
    """Whether parsed tokenizer-file JSON is a Hugging Face tokenizer.json (it has "model", not "format").

    >>> is_hf_json({"model": {}}), is_hf_json({"format": "euler-bpe"})
    (True, False)
    """
    return isinstance(data, dict) and "model" in data and "format" not in data


def from_hf_dict(data: dict[str, Any]) -> Vocab:
    """The vocabulary of the parsed JSON of a tokenizer.json."""
    if data.get("normalizer") is not None:
        raise TokenizerFileError("from_hf: normalizers are not supported (byte-level BPE has none)")
    model = data.get("model")
    _check_model(model)
    pattern = _pattern_of(data.get("pre_tokenizer"))
    merges = [tuple(m) if isinstance(m, list) else m for m in model["merges"]]
    pairs = [m for m in merges if isinstance(m, tuple)]
    pairs += read_merge_lines([m for m in merges if isinstance(m, str)], "from_hf")
    if len(pairs) != len(merges):
        raise TokenizerFileError("from_hf: merges must be all 'a b' strings or all [a, b] lists")
    vocab = dict(model["vocab"])
    for added in data.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
    built = build_from_strings(vocab, pairs, "from_hf")
    specials = {a["content"]: a["id"] for a in data.get("added_tokens") or []}
    extra = {s: i for s, i in built.special_tokens.items() if s not in specials}
    if extra:
        raise TokenizerFileError(
            f"from_hf: tokens {list(extra)[:5]} are neither bytes, merged nor added tokens"
        )
    return make_vocab(built.tokens, built.merges, specials, pattern)


def from_hf(path: str | os.PathLike) -> Vocab:
    data = read_json(path, "from_hf")
    if not isinstance(data, dict):
        raise TokenizerFileError(f"from_hf: {path} does not hold a JSON object")
    return from_hf_dict(data)


def _added(token_id: int, name: str) -> dict[str, Any]:
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
    return {"id": token_id, "content": name, **flags, "special": True}


def to_hf_dict(tok: Vocab) -> dict[str, Any]:
    """The tokenizer.json content for `tok` (specials as added tokens, not in model.vocab)."""
    special_ids = set(tok.special_tokens.values())
    vocab = {bytes_to_chars(t): i for i, t in enumerate(tok.tokens) if i not in special_ids}
    chars = [bytes_to_chars(t) if i not in special_ids else "" for i, t in enumerate(tok.tokens)]
    model = {
        "type": "BPE",
        **{"dropout": None, "unk_token": None, "continuing_subword_prefix": None, "end_of_word_suffix": None},
        **{"fuse_unk": False, "byte_fallback": False, "ignore_merges": False},
        "vocab": vocab,
        "merges": [f"{chars[a]} {chars[b]}" for a, b in tok.merges],
    }
    added = [_added(i, s) for s, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])]
    return {
        **{"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None},
        "pre_tokenizer": _pre_tokenizer(tok.pattern),
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": model,
    }


def to_hf(tok: Vocab, path: str | os.PathLike) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_hf_dict(tok), f, ensure_ascii=False)
