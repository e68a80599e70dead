"""GPT-2's reversible map between the 256 byte values and printable Unicode characters.

Hugging Face `tokenizer.json` files and GPT-2's `encoder.json` / `vocab.bpe` spell every token as a
string of these characters, so that no token contains a space or a control character.

>>> BYTE_TO_CHAR[ord(" ")], BYTE_TO_CHAR[ord("A")]
('Ġ', 'A')
>>> chars_to_bytes("Ġhello")
b' hello'
"""

from __future__ import annotations


def _byte_to_char() -> dict[int, str]:
    """Printable Latin-1 bytes map to themselves; the other 68 bytes map to U+0100 upwards, in byte order."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in mapping)
    for n, b in enumerate(shifted):
        mapping[b] = chr(256 + n)
    return mapping


BYTE_TO_CHAR: dict[int, str] = _byte_to_char()
CHAR_TO_BYTE: dict[str, int] = {c: b for b, c in BYTE_TO_CHAR.items()}


def bytes_to_chars(data: bytes) -> str:
    """b' hi' -> 'Ġhi' (the spelling used in tokenizer.json and encoder.json)."""
    return "".join(BYTE_TO_CHAR[b] for b in data)


def chars_to_bytes(text: str) -> bytes:
    """'Ġhi' -> b' hi'; raises ValueError on a character outside the byte alphabet."""
    try:
        return bytes(CHAR_TO_BYTE[c] for c in text)
    except KeyError as err:
        raise ValueError(
            f"chars_to_bytes: {err.args[0]!r} in {text!r} is not a byte-level character"
        ) from None
