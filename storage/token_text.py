"""Each token's text, as recorded in ``Trajectory.token_text`` and the ``tokens`` table: joined,
the texts reproduce ``tokenizer.decode`` of the whole sequence. Torch-free; core/model/policy.py
re-exports ``token_texts``.
"""
from __future__ import annotations

import codecs
import re
import weakref


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
_TO_BYTES = {ord(c): b for c, b in BYTE_DECODER.items()}
_NOT_LATIN = re.compile("[\x80-\xa0\xad]")
"""Characters below 256 outside the byte-level alphabet: UTF-8 encodes them in two bytes."""


def _raw(piece: str) -> bytes:
    """The bytes a byte-level token's piece stands for: its alphabet's characters as the byte
    each encodes, any other character as its UTF-8 (a special token's text)."""
    if not _NOT_LATIN.search(piece):
        try:  # one translate and one encode in C, instead of a step per character
            return piece.translate(_TO_BYTES).encode("latin-1")
        except UnicodeEncodeError:
            pass
    return b"".join(bytes([BYTE_DECODER[c]]) if c in BYTE_DECODER else c.encode()
                    for c in piece)


def is_byte_level(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and type(backend.decoder).__name__ == "ByteLevel"


_VOCAB: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
"""Per tokenizer, what its tokens seen so far are: {id: text} of those whose bytes are whole
UTF-8 on their own, {id: bytes} of the others (a character cut across tokens). Bounded by the
vocabulary; an importer decodes 10^5-10^6 tokens a step, a few thousand distinct ones."""


def _vocab(tokenizer, ids: list[int]) -> tuple[dict[int, str], dict[int, bytes]]:
    """The tokenizer's ``_VOCAB`` entry, learning the ids of ``ids`` it has not seen yet."""
    try:
        whole, partial = _VOCAB.setdefault(tokenizer, ({}, {}))
    except TypeError:  # a tokenizer that cannot be weakly referenced: learnt for this call only
        whole, partial = {}, {}
    new = set(ids).difference(whole).difference(partial)
    if new:
        new = list(new)
        for i, piece in zip(new, tokenizer.convert_ids_to_tokens(new)):
            raw = _raw(piece)
            try:
                whole[i] = raw.decode("utf-8")
            except UnicodeDecodeError:
                partial[i] = raw
    return whole, partial


def token_texts(tokenizer, ids: list[int]) -> list[str]:
    """Text of each token such that ``''.join(token_texts(ids)) == tokenizer.decode(ids)``.

    A character split over several byte-level tokens is attributed to the token that completes
    it (earlier ones get ''), so concatenation never produces stray replacement characters.
    When every token's bytes are whole UTF-8 on their own (no character cut), each text is its
    token's, looked up (``_VOCAB``) instead of decoded.
    """
    if not is_byte_level(tokenizer):
        return _texts_by_prefix(tokenizer, ids)
    ids = list(map(int, ids))
    whole, partial = _vocab(tokenizer, ids)
    if not partial or partial.keys().isdisjoint(ids):
        return [whole[i] for i in ids]
    texts = [whole.get(i) for i in ids]
    done = 0
    for start in [j for j, text in enumerate(texts) if text is None]:
        if start >= done:
            done = _decode_from(texts, ids, start, whole, partial)
    return texts


def _decode_from(texts: list, ids: list[int], start: int, whole: dict, partial: dict) -> int:
    """Decode ``ids`` into ``texts`` from ``start`` (a token whose bytes are not whole UTF-8)
    until the decoder holds no cut character and the next token is whole again: what one
    decoder over the whole sequence gives there, since it holds nothing before ``start``.
    Returns where it stopped."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    j = start
    while j < len(ids):
        i = ids[j]
        texts[j] = decoder.decode(partial[i] if i in partial else whole[i].encode())
        j += 1
        if not decoder.getstate()[0] and (j == len(ids) or ids[j] not in partial):
            return j
    texts[-1] += decoder.decode(b"", final=True)
    return j


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
