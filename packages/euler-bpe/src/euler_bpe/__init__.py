"""euler-bpe: a hand-written byte-level BPE tokenizer (GPT-2 pretokenization), standalone.

>>> from euler_bpe import Tokenizer, CHAT_SPECIAL_TOKENS
>>> tok = Tokenizer.train(["the cat sat on the mat"], vocab_size=300, special_tokens=CHAT_SPECIAL_TOKENS)
>>> tok.decode(tok.encode("the cat"))
'the cat'
"""

from euler_bpe.__about__ import __version__
from euler_bpe._pretokenize import GPT2_PATTERN
from euler_bpe._train import vocab_note
from euler_bpe.errors import TokenizerFileError
from euler_bpe.specials import CHAT_SPECIAL_TOKENS, ENDOFTEXT
from euler_bpe.tokenizer import Tokenizer

__all__ = [
    "CHAT_SPECIAL_TOKENS",
    "ENDOFTEXT",
    "GPT2_PATTERN",
    "Tokenizer",
    "TokenizerFileError",
    "__version__",
    "vocab_note",
]
