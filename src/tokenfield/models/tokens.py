"""A readable form of one token, also when it holds part of a character.

Byte-level tokenizers (GPT-2 style, SmolLM2) and SentencePiece with byte
fallback (Gemma) split an emoji or a Hebrew letter into tokens that each hold
some of its UTF-8 bytes; ``tokenizer.decode([id])`` turns such a token into
``"\\ufffd"`` (``�``), which says nothing about which token it was. A trace
therefore stores, per particle, the ``token_id`` and :func:`token_piece`: the
token's text where its bytes are whole UTF-8, with every byte of a partial
character written as ``<0xNN>`` (e.g. ``<0xF0><0x9F>`` for the first half of
🍕, ``" <0xD7>"`` for a space and the first byte of a Hebrew letter).

Example:
    >>> token_piece(tokenizer, 9468)  # doctest: +SKIP
    '<0xF0><0x9F>'
"""

from __future__ import annotations

import codecs
import re
from functools import cache
from typing import Any

__all__ = ["TokenTexts", "token_piece", "escape_bytes"]

_HEX = "tokenfield-hex"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _hex_escape(error: UnicodeError) -> tuple[str, int]:
    chunk = error.object[error.start : error.end]  # type: ignore[attr-defined]
    return "".join(f"<0x{b:02X}>" for b in chunk), error.end  # type: ignore[attr-defined]


codecs.register_error(_HEX, _hex_escape)


def escape_bytes(raw: bytes) -> str:
    """UTF-8 text, with each byte that is not part of a whole character as ``<0xNN>``."""
    return raw.decode("utf-8", errors=_HEX)


@cache
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: byte-level BPE tokens spell
    their bytes with these 256 printable characters (``Ġ`` is the space)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    codes = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return {chr(code): byte for byte, code in zip(printable, codes, strict=True)}


def token_piece(tokenizer: Any, token_id: int) -> str:
    """A readable form of one token (see the module docstring).

    Whole characters are returned as ``tokenizer.decode`` gives them; only a
    token that decodes to ``�`` is spelled from its bytes: SentencePiece's
    byte tokens (``<0xF0>``) as they are, byte-level BPE tokens through GPT-2's
    byte alphabet. A token neither can spell is returned as the tokenizer's
    own piece (``convert_ids_to_tokens``).
    """
    text = tokenizer.decode([int(token_id)])
    if "\ufffd" not in text:
        return text
    piece = tokenizer.convert_ids_to_tokens(int(token_id))
    if not isinstance(piece, str) or not piece:
        return text
    if _BYTE_TOKEN.fullmatch(piece):
        return f"<0x{piece[3:5].upper()}>"
    alphabet = _byte_level_alphabet()
    if all(char in alphabet for char in piece):
        return escape_bytes(bytes(alphabet[char] for char in piece))
    return piece


class TokenTexts:
    """``tokenizer.decode([id])`` and :func:`token_piece` of single tokens, each
    worked out once per id (a trace decodes every kept token, and ids repeat)."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}
        self._pieces: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        token_id = int(token_id)
        text = self._texts.get(token_id)
        if text is None:
            text = self._texts[token_id] = self.tokenizer.decode([token_id])
        return text

    def piece(self, token_id: int) -> str:
        token_id = int(token_id)
        piece = self._pieces.get(token_id)
        if piece is None:
            piece = self._pieces[token_id] = token_piece(self.tokenizer, token_id)
        return piece
