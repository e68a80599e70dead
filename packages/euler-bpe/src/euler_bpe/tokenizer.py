"""The Tokenizer: byte-level BPE with GPT-2 pretokenization, special tokens, files and interop.

>>> tok = Tokenizer.train(["low lower lowest " * 20], vocab_size=262, special_tokens=["<|end|>"])
>>> ids = tok.encode("lower<|end|>", allowed_special="all")
>>> tok.decode(ids), ids[-1] == tok.special_tokens["<|end|>"]
('lower<|end|>', True)
"""

from __future__ import annotations

import operator
import os
from array import array
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Literal

from euler_bpe import _gpt2, _hf, _io
from euler_bpe._corpus import Source, count_words, sample_pieces
from euler_bpe._encode import WordEncoder
from euler_bpe._parallel import WorkerPool
from euler_bpe._pretokenize import GPT2_PATTERN, special_splitter
from euler_bpe._train import learn_merges
from euler_bpe._vocab import Vocab, make_vocab
from euler_bpe.progress import progress_stream

AllowedSpecial = Literal["all"] | Collection[str]


class Tokenizer:
    """Byte-level BPE. `tokens[i]` is the bytes of id i; `merges` are (left id, right id) in rank order.

    Special tokens have ids of their own; their bytes (the UTF-8 of their name) are what `decode` shows.
    Treat `tokens`, `merges`, `special_tokens` and `pattern` as read-only: `fingerprint` is computed once.
    """

    def __init__(
        self,
        tokens: Sequence[bytes],
        merges: Sequence[tuple[int, int]],
        special_tokens: Mapping[str, int] | None = None,
        pattern: str = GPT2_PATTERN,
    ):
        self._use(make_vocab(tokens, merges, special_tokens, pattern))

    @classmethod
    def _from_vocab(cls, vocab: Vocab) -> Tokenizer:
        """The tokenizer of an already checked vocabulary (what the file readers return)."""
        tok = cls.__new__(cls)
        tok._use(vocab)
        return tok

    def _use(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self.special_tokens: dict[str, int] = vocab.special_tokens
        self.tokens: list[bytes] = vocab.tokens
        self.merges: list[tuple[int, int]] = vocab.merges
        self.pattern = vocab.pattern
        self._encoder = WordEncoder(vocab.tables.byte_ids, vocab.tables.merges, vocab.pattern)
        self._splitters: dict[frozenset[str], object] = {}
        self._pool = None  # worker processes of encode_batch, kept between calls (warm caches)

    # ---- training -------------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        texts: Iterable[Source],
        vocab_size: int,
        special_tokens: Sequence[str] = (),
        *,
        pattern: str = GPT2_PATTERN,
        sample_bytes: int | None = None,
        workers: int = 1,
        progress: bool | Callable[[int, int], None] = False,
    ) -> Tokenizer:
        """Learn merges from `texts` (str: text, bytes: UTF-8, os.PathLike: a file) up to `vocab_size`.

        `vocab_size` counts the 256 bytes, the merges and the special tokens, which take the last ids.
        `sample_bytes` trains on about that much of the corpus, spread evenly; `workers` processes
        pretokenize. If the corpus runs out of pairs, the vocabulary is smaller than asked.
        """
        specials = list(special_tokens)
        if len(set(specials)) != len(specials) or not all(isinstance(s, str) and s for s in specials):
            raise ValueError(f"train: special tokens must be distinct non-empty strings, got {specials}")
        if not isinstance(vocab_size, int) or isinstance(vocab_size, bool):
            raise ValueError(f"train: vocab_size must be an int, got {vocab_size!r}")
        if vocab_size < 256 + len(specials):
            raise ValueError(
                f"train: vocab_size={vocab_size} is smaller than 256 bytes + {len(specials)} special tokens"
            )
        sources = [texts] if isinstance(texts, (str, bytes, os.PathLike)) else texts
        counts = count_words(sample_pieces(sources, sample_bytes), pattern, specials, workers)
        if not counts:
            raise ValueError("train: the corpus is empty (no text to learn merges from)")
        report = _progress_printer() if progress is True else (progress or None)
        words: dict[bytes, list[int]] = {}
        merges, tokens = learn_merges(counts, vocab_size - len(specials), report, words)
        fresh = len(tokens) == 256 + len(merges)
        special_ids = {s: len(tokens) + k for k, s in enumerate(specials)}
        tokens += [s.encode("utf-8") for s in specials]
        tok = cls(tokens, [(a, b) for a, b, _ in merges], special_ids, pattern)
        if fresh:
            # Every merge made a new token, so no pair of a lower rank can appear after a merge:
            # training merged each word exactly as encoding will. Its words start the cache.
            tok._encoder.warm(words)
        return tok

    # ---- encoding -------------------------------------------------------------------------------
    def _allowed(self, allowed_special: AllowedSpecial) -> frozenset[str]:
        if allowed_special == "all":
            return frozenset(self.special_tokens)
        if isinstance(allowed_special, str):
            raise ValueError(
                f"encode: allowed_special must be 'all' or a set of names, got {allowed_special!r}"
            )
        allowed = frozenset(allowed_special)
        unknown = allowed - self.special_tokens.keys()
        if unknown:
            raise ValueError(
                f"encode: unknown special tokens {sorted(unknown)}; known: {list(self.special_tokens)}"
            )
        return allowed

    def encode(self, text: str, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Token ids of `text`. Special tokens count only when named in `allowed_special` (or "all");
        otherwise they are plain text. Lone surrogates in `text` are encoded as U+FFFD (like tiktoken).

        >>> Tokenizer.byte_level().encode("hi")
        [104, 105]
        """
        if not isinstance(text, str):
            raise TypeError(f"encode: expected str, got {type(text).__name__}")
        return self._encode(text, allowed_special, raw=False)

    def _encode(self, text: str, allowed_special: AllowedSpecial, raw: bool) -> list[int]:
        allowed = self._allowed(allowed_special) if allowed_special else frozenset()
        if not allowed:
            return self._encoder.encode(text, raw)
        if allowed not in self._splitters:
            self._splitters[allowed] = special_splitter(sorted(allowed))
        out: list[int] = []
        for k, part in enumerate(self._splitters[allowed].split(text)):
            # split() alternates text, special, text, ...
            out += [self.special_tokens[part]] if k % 2 else self._encoder.encode(part, raw)
        return out

    def _encode_array(self, text: str, allowed_special: AllowedSpecial, raw: bool, typecode: str) -> array:
        """`_encode` as an array of `typecode`, packed by the encoder itself when no special is allowed."""
        if allowed_special:
            return array(typecode, self._encode(text, allowed_special, raw))
        ids = self._encoder.encode_array(text, raw)
        return ids if ids.typecode == typecode else array(typecode, ids)

    def encode_bytes(self, data: bytes, allowed_special: AllowedSpecial = frozenset()) -> list[int]:
        """Ids of raw bytes, valid UTF-8 or not; `decode_bytes` gives the same bytes back."""
        return self._encode(bytes(data).decode("utf-8", "surrogateescape"), allowed_special, raw=True)

    def encode_batch(
        self,
        texts: Sequence[str],
        allowed_special: AllowedSpecial = frozenset(),
        workers: int = 1,
        typecode: str | None = None,
    ) -> list[list[int]] | list[array]:
        """`[encode(t) for t in texts]`, in `workers` processes when > 1.

        The worker processes start on the first such call and stay (with their word caches) until
        `close()`, garbage collection of the tokenizer, or exit. Small batches run in this process.
        With `typecode` (e.g. "H" for uint16 shards) each result is an `array.array` of that type
        instead of a list, which saves converting ids to Python ints and back; OverflowError if the
        vocabulary's ids do not fit that type.

        >>> Tokenizer.byte_level().encode_batch(["hi"], typecode="H")
        [array('H', [104, 105])]
        """
        texts = list(texts)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("encode_batch: every text must be a str")
        return self._encode_batch(texts, allowed_special, workers, raw=False, typecode=typecode)

    def _encode_batch(
        self,
        texts: list[str],
        allowed_special: AllowedSpecial,
        workers: int,
        raw: bool,
        typecode: str | None = None,
    ) -> list[list[int]] | list[array]:
        allowed = self._allowed(allowed_special) if allowed_special else frozenset()  # fail here
        if typecode:  # the same check in every path: fail before any work
            try:
                array(typecode, [self.vocab_size - 1])
            except OverflowError:
                raise OverflowError(
                    f"encode_batch: ids up to {self.vocab_size - 1} do not fit array typecode {typecode!r}"
                ) from None
        small = len(texts) < 2 or sum(map(len, texts)) < 1 << 16
        if workers <= 1 or small or not self.merges:  # no merges: encoding is one str.encode per text
            if typecode:
                return [self._encode_array(t, allowed, raw, typecode) for t in texts]
            return [self._encode(t, allowed, raw) for t in texts]
        if self._pool is None or self._pool.workers != workers:
            self.close()
            self._pool = WorkerPool(self, _io.to_dict(self._vocab), _rebuilt, workers)
        return self._pool.encode(texts, allowed, raw, typecode)

    def close(self) -> None:
        """Stop the worker processes of `encode_batch(..., workers>1)`, if any (also done at exit)."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # ---- decoding -------------------------------------------------------------------------------
    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        """The bytes of the tokens, concatenated; raises ValueError on an id outside the vocabulary."""
        ids = list(ids)
        if ids and (min(ids) < 0 or max(ids) >= len(self.tokens)):
            bad = next(i for i in ids if not 0 <= i < len(self.tokens))
            raise ValueError(f"decode: id {bad} is outside the vocabulary 0..{len(self.tokens) - 1}")
        return b"".join(map(self.tokens.__getitem__, ids))

    def decode(self, ids: Iterable[int], errors: str = "replace") -> str:
        """Text of `ids`; partial UTF-8 becomes U+FFFD, or raises UnicodeDecodeError with errors="strict"."""
        return self.decode_bytes(ids).decode("utf-8", errors)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token (a special token's are the UTF-8 of its name); any integer type.

        >>> Tokenizer.byte_level().token_bytes(104)
        b'h'
        """
        i = _as_index(token_id)
        if i is None or not 0 <= i < len(self.tokens):
            raise ValueError(f"token_bytes: id {token_id!r} is outside 0..{self.vocab_size - 1}")
        return self.tokens[i]

    # ---- properties and files -------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    @property
    def is_byte_level(self) -> bool:
        """True for the byte tokenizer (`byte_level`): no merges, id b is the byte b, specials after.

        >>> Tokenizer.byte_level(["<|endoftext|>"]).is_byte_level
        True
        """
        return self._vocab.is_byte_level

    @property
    def kind(self) -> str:
        """The kind: "bytes" for the byte tokenizer (`is_byte_level`), else "bpe"; saved files record it."""
        return self._vocab.kind

    @property
    def fingerprint(self) -> str:
        """SHA-256 (hex) of the tokenizer's content: equal fingerprints mean equal encodings."""
        return self._vocab.fingerprint

    def save(self, path: str | os.PathLike) -> None:
        """Write the euler-bpe JSON format (see `_io`)."""
        _io.save(self._vocab, path)

    @classmethod
    def load(cls, path: str | os.PathLike) -> Tokenizer:
        """Read a file written by `save` (or a Hugging Face tokenizer.json); TokenizerFileError if bad."""
        data = _io.read_json(path, "load")
        return cls._from_vocab(_hf.from_hf_dict(data) if _hf.is_hf_json(data) else _io.from_dict(data))

    @classmethod
    def byte_level(cls, special_tokens: Sequence[str] = ()) -> Tokenizer:
        """The byte tokenizer: ids 0-255 are the byte values, no merges, the special tokens after them.

        Any byte string is `encode_bytes`-ed to its own bytes as ids; `encode` gives the UTF-8 bytes.

        >>> tok = Tokenizer.byte_level(["<|endoftext|>"])
        >>> tok.encode("é"), tok.encode_bytes(b"\\xff\\x00"), tok.special_tokens
        ([195, 169], [255, 0], {'<|endoftext|>': 256})
        """
        specials = {s: 256 + k for k, s in enumerate(special_tokens)}
        return cls([bytes([b]) for b in range(256)] + [s.encode() for s in special_tokens], [], specials)

    @classmethod
    def from_gpt2(cls, vocab_bpe: str | os.PathLike, encoder_json: str | os.PathLike) -> Tokenizer:
        """GPT-2's original `vocab.bpe` (merges) and `encoder.json` (token -> id)."""
        return cls._from_vocab(_gpt2.from_gpt2(vocab_bpe, encoder_json))

    @classmethod
    def from_hf(cls, tokenizer_json: str | os.PathLike) -> Tokenizer:
        """A Hugging Face `tokenizer.json` with a ByteLevel BPE model."""
        return cls._from_vocab(_hf.from_hf(tokenizer_json))

    def to_hf(self, path: str | os.PathLike) -> None:
        """Write a Hugging Face `tokenizer.json` that the `tokenizers` library encodes identically with."""
        _hf.to_hf(self._vocab, path)

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"special_tokens={list(self.special_tokens)}, fingerprint={self.fingerprint[:12]})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.fingerprint == other.fingerprint

    __hash__ = None  # mutable-looking object: compare, don't hash


def _rebuilt(state: dict) -> Tokenizer:
    """A spawned encode_batch worker's copy of the tokenizer, from `_io.to_dict`'s state (see `_parallel`)."""
    return Tokenizer._from_vocab(_io.from_dict(state, check_fingerprint=False))


def _as_index(value: object) -> int | None:
    """An integer of any type (int, NumPy's, ...) as int; None for anything else (bool included)."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _progress_printer() -> Callable[[int, int], None]:
    """A one-line progress bar on stderr (no dependency; plain lines when stderr is not a terminal)."""
    out = progress_stream()

    def show(done: int, total: int) -> None:
        if done % 64 == 0 or done == total:
            filled = int(30 * done / max(total, 1))
            out.write(f"\rtokens [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}")
            if done == total:
                out.write("\n")
            out.flush()

    return show
