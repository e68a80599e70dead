"""The recipe: which sources to read, how to filter, split, mix and tokenize them.

A recipe is a TOML or JSON file; every field has a default, so ``sources`` is all it needs::

    vocab_size = 4096
    [[source]]
    spec = "gutenberg:1342,84"
    [[source]]
    spec = "web/c4.jsonl"
    weight = 2.0
"""

from __future__ import annotations

import json
import math
import types
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

from euler_bpe import CHAT_SPECIAL_TOKENS
from euler_data.errors import DataError

try:
    import tomllib
except ImportError:  # pragma: no cover - Python 3.10: tomli if installed, else only JSON recipes
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

# how a text file is cut into documents; "raw": each file whole, its bytes as they are (bytes mode)
SPLIT_MODES = ("document", "line", "paragraph", "eot", "raw")
NAMED = ("gutenberg", "fineweb-edu", "alpaca", "hh-rlhf", "tinyshakespeare")
BYTE_TOKENIZER = "bytes"  # tokenizer = "bytes": ids 0-255 are the raw bytes, the chat special tokens follow


@dataclass(frozen=True)
class SourceSpec:
    """One source: a local file/folder or a named source, e.g. ``SourceSpec("gutenberg:11,84")``.

    ``docs`` picks how a .txt file becomes documents ("document": whole file, "line", "paragraph": blank
    line, "eot": the literal ``<|endoftext|>``), or "raw": every file of the source, of any type, is one
    document of its exact bytes (no cleaning; needs the byte tokenizer); ``split`` is "hash" (by document
    hash) or "position" (first 1 - val_fraction of the text to train, the rest to val).
    """

    spec: str
    name: str = ""  # defaults to the named source or the file stem
    weight: float = 1.0  # mixing weight of the train documents (2.0 = each twice)
    docs: str = "document"
    split: str = "auto"  # "hash", "position", or "auto": position for tinyshakespeare, else hash
    min_score: float | None = None  # drop rows whose score is below this (FineWeb-Edu)
    text_field: str = "text"  # JSON / parquet field holding the text
    score_field: str = "score"  # ... and the score (FineWeb-Edu also has "int_score")

    def __post_init__(self) -> None:
        check_fields(self)
        if self.docs not in SPLIT_MODES:
            raise ValueError(f"SourceSpec: docs={self.docs!r} is not one of {SPLIT_MODES}")
        if self.split not in ("auto", "hash", "position"):
            raise ValueError(f"SourceSpec: split={self.split!r} is not 'auto', 'hash' or 'position'")

    @property
    def kind(self) -> str:
        """The named source ("gutenberg", ...) or "local"."""
        head = self.spec.split(":", 1)[0]
        return head if head in NAMED else "local"

    @property
    def split_mode(self) -> str:
        """How documents go to train/val: Tiny Shakespeare (one document) and raw files split by position."""
        if self.split != "auto":
            return self.split
        return "position" if self.kind == "tinyshakespeare" or self.docs == "raw" else "hash"

    @property
    def label(self) -> str:
        """The name counted in meta.json: ``name`` or else derived from the spec."""
        if self.name:
            return self.name
        return self.kind if self.kind != "local" else Path(self.spec).name.split(".")[0]


@dataclass(frozen=True)
class FilterConfig:
    """Document filters; a document failing several is counted under the first reason."""

    min_chars: int = 200  # shorter cleaned documents are dropped ("too_short")
    max_chars: int = 50_000_000  # longer ones too ("too_long"); Gutenberg books are ~3 MB
    min_alpha_ratio: float = 0.55  # letters + spaces over characters ("not_prose")
    min_words: int = 20  # whitespace-separated words ("too_few_words")
    near_dedup: bool = True  # also drop documents equal after lower-casing and stripping punctuation
    minhash_threshold: float | None = None  # e.g. 0.7: also drop MinHash-similar documents (slower)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Recipe:
    """Everything ``prepare`` needs; see the module docstring for the file format."""

    sources: tuple[SourceSpec, ...] = ()
    vocab_size: int = 4096
    tokenizer: str | None = None  # an existing tokenizer.json instead of training one
    tokenizer_sample_bytes: int = 4_000_000  # train the tokenizer on this much train text
    val_fraction: float = 0.1
    seed: int = 0
    context_hint: int = 512  # the context length this set is meant for (written to meta.json)
    workers: int = 2  # tokenization processes
    shard_tokens: int = 1 << 30  # a train split above this many tokens is cut into shards of this size
    filter: FilterConfig = field(default_factory=FilterConfig)

    def __post_init__(self) -> None:
        check_fields(self)
        smallest = 256 + len(CHAT_SPECIAL_TOKENS) + 1  # the bytes, the specials and one merge
        if self.tokenizer is None and self.vocab_size < smallest:
            raise ValueError(
                f"Recipe: vocab_size={self.vocab_size} leaves no merges to learn after the 256 bytes and "
                f"{len(CHAT_SPECIAL_TOKENS)} special tokens (at least {smallest}); for a byte-level "
                f'vocabulary use tokenizer = "{BYTE_TOKENIZER}" (--tokenizer {BYTE_TOKENIZER})'
            )
        raw = [s.label for s in self.sources if s.docs == "raw"]
        if raw and self.tokenizer != BYTE_TOKENIZER:
            raise ValueError(
                f"Recipe: sources {raw} are read as raw bytes (::raw), which needs "
                f'tokenizer = "{BYTE_TOKENIZER}" (--tokenizer {BYTE_TOKENIZER})'
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# field -> (rule, what the rule says, the flag that sets the field): checked for every recipe, file or flags
LIMITS = {
    "weight": (lambda v: 0 <= v < math.inf, "a finite number >= 0", "--weight NAME=W"),
    "min_chars": (lambda v: v >= 0, ">= 0", "--min-chars"),
    "max_chars": (lambda v: v >= 1, ">= 1", None),
    "min_alpha_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]", None),
    "min_words": (lambda v: v >= 0, ">= 0", None),
    "minhash_threshold": (lambda v: 0 < v <= 1, "in (0, 1]", "--minhash"),
    "vocab_size": (lambda v: v <= 65536, "at most 65536 (uint16 shards)", "--vocab-size"),
    "tokenizer_sample_bytes": (lambda v: v >= 1, ">= 1", None),
    "val_fraction": (lambda v: 0 <= v < 1, "in [0, 1)", "--val-fraction"),
    "context_hint": (lambda v: v >= 1, ">= 1", "--context"),
    "workers": (lambda v: v >= 1, ">= 1", "--workers"),
    "shard_tokens": (lambda v: v >= 1, ">= 1", "--shard-tokens"),
}
TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def check_fields(obj: Any) -> None:
    """Each field of a recipe dataclass has its annotated type and keeps its LIMITS; else one ValueError
    naming the field, e.g. ``vocab_size must be an integer, got 'big'``."""
    for name, hint in get_type_hints(type(obj)).items():
        value = getattr(obj, name)
        kinds = get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        if not any(_is_a(value, kind) for kind in kinds):
            expected = " or ".join(TYPE_NAMES.get(k, str(k)) for k in kinds if k is not type(None))
            raise ValueError(f"{name} must be {expected}, got {value!r}")
        rule, says, flag = LIMITS.get(name, (None, "", None))
        if rule is not None and value is not None and not rule(value):
            raise ValueError(f"{name} must be {says}, got {value!r}" + (f" ({flag})" if flag else ""))


def _is_a(value: Any, kind: Any) -> bool:
    """isinstance, where a bool is no number and a float field takes an int (TOML writes 0, not 0.0)."""
    if kind is type(None):
        return value is None
    if kind in (int, float):
        return isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    return isinstance(value, get_origin(kind) or kind)


def _known(cls: type, data: dict[str, Any], where: str) -> dict[str, Any]:
    """Check that ``data`` only uses fields of dataclass ``cls``."""
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise DataError(where, f"unknown recipe keys {unknown}; known: {sorted(names)}")
    return data


def check_vocab_size(tokenizer: str | None, vocab_size: int | None, where: str) -> None:
    """``vocab_size`` sizes a trained tokenizer: given with a tokenizer (a file or "bytes"), a DataError."""
    if tokenizer is None or vocab_size is None:
        return
    if tokenizer == BYTE_TOKENIZER:
        fixed = "the byte tokenizer's vocabulary is fixed: 256 bytes + the chat special tokens"
    else:
        fixed = f"the vocabulary is that of {tokenizer}"
    raise DataError(where, f"vocab_size={vocab_size} applies only when a tokenizer is trained; {fixed}")


def recipe_from_dict(data: dict[str, Any], where: str = "recipe") -> Recipe:
    """Build a Recipe from parsed TOML/JSON, e.g. ``recipe_from_dict({"source": [{"spec": "alpaca"}]})``."""
    data = dict(data)
    check_vocab_size(data.get("tokenizer"), data.get("vocab_size"), where)
    raw_sources = data.pop("source", data.pop("sources", []))
    if not isinstance(raw_sources, list):
        raise DataError(where, f"source must be a list of [[source]] tables, got {raw_sources!r}")
    sources = []
    for item in raw_sources:
        item = {"spec": item} if isinstance(item, str) else item
        if not isinstance(item, dict):
            raise DataError(where, f'each source must be a string or a table with spec = "...", got {item!r}')
        sources.append(SourceSpec(**_known(SourceSpec, item, where)))
    filt = data.pop("filter", {})
    if not isinstance(filt, dict):
        raise DataError(where, f"filter must be a [filter] table, got {filt!r}")
    return Recipe(
        sources=tuple(sources),
        filter=FilterConfig(**_known(FilterConfig, filt, where)),
        **_known(Recipe, data, where),
    )


def load_recipe(path: str | Path) -> Recipe:
    """Read a ``.toml`` or ``.json`` recipe file."""
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            data = json.loads(text)
        else:
            data = _load_toml(text)
    except ValueError as err:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise DataError(str(path), f"cannot parse recipe: {err}") from err
    if not isinstance(data, dict):
        raise DataError(str(path), f"a recipe is a table of keys, got {type(data).__name__}")
    try:
        return recipe_from_dict(data, str(path))
    except DataError:
        raise
    except (TypeError, ValueError) as err:  # a missing spec, or a field of the wrong type or out of range
        raise DataError(str(path), str(err)) from err


def _load_toml(text: str) -> dict[str, Any]:
    if tomllib is None:  # pragma: no cover - Python 3.10 without tomli
        raise ValueError("TOML recipes need Python 3.11+ or `tomli`; use a .json recipe")
    return tomllib.loads(text)
