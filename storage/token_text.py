"""Each token's text, as recorded in ``Trajectory.token_text`` and the ``tokens`` table: joined,
the texts reproduce ``tokenizer.decode`` of the whole sequence. Torch-free; core/model/policy.py
re-exports ``token_texts``.
"""
from __future__ import annotations

import codecs


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> the byte it encodes."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(keep, chars)}


BYTE_DECODER = _byte_decoder()


def is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Text of each token such that ``''.join(token_texts(ids)) == tokenizer.decode(ids)``.

    A character split over several byte-level tokens is attributed to the token that completes
    it (earlier ones get ''), so concatenation never produces stray replacement characters.
    """
    if not is_byte_level(tokenizer):
        return _texts_by_prefix(tokenizer, ids)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    texts = []
    for piece in tokenizer.convert_ids_to_tokens(list(ids)):
        raw = b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode() for c in piece)
        texts.append(decoder.decode(raw))
    if texts:
        texts[-1] += decoder.decode(b"", final=True)
    return texts


def _texts_by_prefix(tokenizer, ids: list[int]) -> list[str]:
    """Fallback for non-byte-level tokenizers: difference of successive prefix decodes (O(n^2))."""
    texts, prev = [], ""
    for i in range(len(ids)):
        cur = tokenizer.decode(ids[:i + 1])
        if (cur.endswith("\ufffd") and i + 1 < len(ids)) or not cur.startswith(prev):
            texts.append("")
            continue
        texts.append(cur[len(prev):])
        prev = cur
    full = tokenizer.decode(list(ids))
    if "".join(texts) != full:  # a decoder that rewrites earlier text: keep the contract whole
        texts = [""] * (len(ids) - 1) + [full]
    return texts
