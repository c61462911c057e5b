"""Each token's text, as recorded in ``Trajectory.token_text`` and the ``tokens`` table: joined,
the texts reproduce ``tokenizer.decode`` of the whole sequence. Torch-free; core/model/policy.py
re-exports ``token_texts``.
"""
from __future__ import annotations

import codecs
import re
import weakref

import numpy as np


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


class _Vocab:
    """What a tokenizer's tokens seen so far are, by id: the text of those whose bytes are whole
    UTF-8 on their own (``whole``, and ``texts`` indexed by id), the bytes of the others
    (``partial``: a character cut across tokens). Bounded by the vocabulary; an importer
    decodes 10^5-10^6 tokens a step, of a few thousand distinct ones."""

    def __init__(self, size: int):
        self.whole: dict[int, str] = {}
        self.partial: dict[int, bytes] = {}
        self.texts = np.full(size, None, object)
        self.state = np.zeros(size, np.int8)  # 0 not seen yet, 1 whole, 2 partial
        self.complete = False  # every id the tokenizer has a piece for learnt (``whole_vocab``)

    def learn(self, tokenizer, ids: np.ndarray) -> None:
        new = np.unique(ids[self.state[ids] == 0]).tolist()
        for i, piece in zip(new, tokenizer.convert_ids_to_tokens(new) if new else []):
            if piece is None:  # an id with no piece (a gap among added tokens): left unlearnt
                continue
            raw = _raw(piece)
            try:
                self.whole[i] = self.texts[i] = raw.decode("utf-8")
                self.state[i] = 1
            except UnicodeDecodeError:
                self.partial[i], self.state[i] = raw, 2


_VOCAB: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def vocab_size(tokenizer) -> int | None:
    """How many ids ``tokenizer`` knows, added tokens included, whatever its kind (a fast
    tokenizer's backend, a slow one's ``len``); None when it cannot say."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.get_vocab_size(with_added_tokens=True)
    try:
        return len(tokenizer)
    except TypeError:
        return None


def checked_ids(tokenizer, ids) -> np.ndarray:
    """``ids`` as a flat int64 array, or ValueError naming the first that is not an integer or
    lies outside the tokenizer's vocabulary (negative ones included): checked before any
    decode, for every kind of tokenizer."""
    arr = np.asarray(ids)
    if arr.size and arr.dtype.kind not in "iu":
        raise ValueError(f"token ids must be integers, got {arr.dtype} values")
    arr = arr.astype(np.int64, copy=False).reshape(-1)
    size = vocab_size(tokenizer)
    if len(arr) and (int(arr.min()) < 0 or (size is not None and int(arr.max()) >= size)):
        bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
        raise ValueError(f"token id {bad} is outside the tokenizer's vocabulary"
                         + (f" of {size}" if size is not None else ""))
    return arr


def _vocab(tokenizer, ids: np.ndarray) -> _Vocab:
    """The tokenizer's ``_Vocab``, having learnt ``ids`` (checked by ``checked_ids``)."""
    size = vocab_size(tokenizer)
    try:
        vocab = _VOCAB.get(tokenizer)
        if vocab is None or len(vocab.state) != size:
            vocab = _VOCAB[tokenizer] = _Vocab(size)
    except TypeError:  # a tokenizer that cannot be weakly referenced: learnt for this call only
        vocab = _Vocab(size)
    vocab.learn(tokenizer, ids)
    return vocab


def whole_vocab(tokenizer) -> _Vocab | None:
    """A byte-level tokenizer's ``_Vocab`` with every id learnt, once per tokenizer (one
    ``convert_ids_to_tokens`` of the whole vocabulary: 49,152 ids took ~0.1 s), for importers
    that index it with arrays (storage/token_columns.py ``token_text_array``); None for any other
    tokenizer, one whose size is unknown, or one that cannot be kept between calls."""
    size = vocab_size(tokenizer)
    if size is None or not is_byte_level(tokenizer):
        return None
    vocab = _vocab(tokenizer, np.zeros(0, np.int64))
    try:
        if _VOCAB.get(tokenizer) is not vocab:
            return None
    except TypeError:  # not kept between calls (no weak reference): learnt per call instead
        return None
    if not vocab.complete:
        vocab.learn(tokenizer, np.arange(size, dtype=np.int64))
        vocab.complete = True
    return vocab


def cut_texts(vocab: _Vocab, ids: np.ndarray) -> list[tuple[int, list[str]]]:
    """(start, texts) of each stretch of ``ids`` (learnt by ``vocab``) that a character cut
    across tokens makes decode as a sequence (``_decode_from``); the rest is each id's own
    text."""
    cuts = np.flatnonzero(vocab.state[ids] == 2).tolist()
    out: list[tuple[int, list[str]]] = []
    if cuts:
        seq, done = ids.tolist(), 0
        texts = [""] * len(seq)
        for start in cuts:
            if start >= done:
                done = _decode_from(texts, seq, start, vocab.whole, vocab.partial)
                out.append((start, texts[start:done]))
    return out


def token_texts(tokenizer, ids) -> list[str]:
    """Text of each token such that ``''.join(token_texts(ids)) == tokenizer.decode(ids)``;
    ValueError for an id outside the vocabulary (``checked_ids``), whatever the tokenizer.

    A character split over several byte-level tokens is attributed to the token that completes
    it (earlier ones get ''), so concatenation never produces stray replacement characters.
    Tokens whose bytes are whole UTF-8 on their own are looked up by id (``_Vocab``); only from
    a token that cuts a character is the sequence decoded, until the cut is closed. Other
    tokenizers (SentencePiece's Metaspace, byte fallback) are decoded a short window at a time
    (``_texts_by_window``): linear in the length, never a decode of every prefix.
    """
    arr = checked_ids(tokenizer, ids)
    if not is_byte_level(tokenizer):
        return _texts_by_window(tokenizer, arr.tolist())
    vocab = _vocab(tokenizer, arr)
    texts = vocab.texts[arr].tolist()
    for start, span in cut_texts(vocab, arr):
        texts[start:start + len(span)] = span
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


WINDOW = 8
"""Tokens decoded before a token to find its text: context enough for a decoder's rules
(a leading space stripped at the start, a character of up to 4 byte-fallback tokens)."""
MAX_PENDING = 16
"""Tokens held back while the decode ends in a cut character; past it the text is given as is."""


def _texts_by_window(tokenizer, ids: list[int]) -> list[str]:
    """Each token's text for a tokenizer that is not byte-level: the difference of decoding
    ``WINDOW`` tokens before it with and without it -- O(n * WINDOW), where the difference of
    successive whole prefixes was O(n^2) (16,384 ids took 115 s). A token that leaves a
    character cut (byte fallback) gets '' and the one completing it the character. If the
    texts do not join to the whole decode (a decoder that rewrites earlier text), the last
    token holds it all, so the contract holds either way."""
    texts, done, n = [], 0, len(ids)
    for i in range(n):
        start = max(0, done - WINDOW)
        before = tokenizer.decode(ids[start:done]) if done > start else ""
        cur = tokenizer.decode(ids[start:i + 1])
        held = i + 1 - done < MAX_PENDING
        if held and ((cur.endswith("\ufffd") and i + 1 < n) or not cur.startswith(before)):
            texts.append("")
            continue
        texts.append(cur[len(before):])
        done = i + 1
    full = tokenizer.decode(ids)
    if "".join(texts) != full:
        texts = [""] * (n - 1) + [full] if n else []
    return texts
