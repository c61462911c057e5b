"""A trainer's token-level rollout held as columns, not as a dict per token.

Why: the importers of verl's batch, SkyRL's generator output and verifiers' traces give
10^5-10^6 tokens a step; a dict per token, validated field by field and turned back into columns
for the insert, held them to 50-75k token rows/s (bench/rl_import.py). Here a trajectory's
tokens are numpy arrays (ids, roles, turns, logprobs...) and one Arrow string array of texts,
validated with array operations under storage/interchange.py's token rules and messages (the
first bad token named), and written as Arrow tables (storage/ingest/import_batch.py), a batch
bounded in rows by storage/token_rows.py's caps as before.

Absent values: ``values[name]`` is a float array with ``present[name]`` saying where a value
was given (a trainer's logprob exists on trained tokens only); absent is NULL in the store.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.recorder import clean_text
from storage.token_text import checked_ids, cut_texts, token_texts, whole_vocab
from storage.trajectory import ROLES, TOKEN, of_kind  # noqa: F401 (ROLES: the codes' names)

PROMPT, ACTION, OBSERVATION = range(3)
LOGPROBS = of_kind(TOKEN, "lp")
"""Log-probabilities: finite and <= 0 (``LOGPROB_SLACK`` above 0 read as 0.0)."""
NUMBERS = of_kind(TOKEN, "num")
VALUE_ORDER = of_kind(TOKEN, "lp", "int", "num")
"""The order storage/interchange.py's TOKEN_FIELDS checks a token's fields in (the trajectory
model's, storage/trajectory.py): the first bad field of the first bad token is the one named,
as the per-token check names it."""
NON_FINITE_ORDER = ("logprob", "train_logprob", "advantage")
"""The order a rollout's token object holds its values in (storage/ingest/rollout_tokens.py
made them so), in which ``refuse_non_finite`` met the first non-finite one."""


def _first(bad: dict[str, np.ndarray], order: tuple[str, ...]) -> tuple[int | None, str]:
    """(the first token any of ``bad``'s masks marks, the first of ``order`` marking it)."""
    firsts = {k: int(np.argmax(b)) for k, b in bad.items() if b.any()}
    if not firsts:
        return None, ""
    at = min(firsts.values())
    return at, next(k for k in order if firsts.get(k) == at)


def texts_array(texts) -> pa.Array:
    """``texts`` (strings) as an Arrow string array, cleaned as every stored text is
    (storage/recorder.py ``clean_text``): one join and one scan when nothing needs it."""
    texts = list(texts)
    joined = "".join(texts)
    if clean_text(joined) != joined:
        texts = [clean_text(t) for t in texts]
    return pa.array(texts, pa.string())


_VOCAB_TEXTS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _vocab_array(vocab) -> pa.Array:
    """The texts of a whole ``_Vocab`` (storage/token_text.py ``whole_vocab``) as one Arrow
    array indexed by id, each cleaned (``texts_array``), '' where an id's bytes cut a character:
    made once per tokenizer."""
    got = _VOCAB_TEXTS.get(vocab)
    if got is None:
        got = _VOCAB_TEXTS[vocab] = texts_array(
            "" if t is None else t for t in vocab.texts.tolist())
    return got


def token_text_array(tokenizer, ids) -> pa.Array:
    """Each token's text (storage/token_text.py ``token_texts``: joined, they are the decode of
    ``ids``) as an Arrow string array, cleaned as every stored text. A byte-level tokenizer's
    texts are taken by id from its vocabulary's, decoded and cleaned once per tokenizer, with
    Python strings made only for a stretch where a character is cut across tokens; any other
    tokenizer's are made as ``token_texts`` makes them. ValueError for an id outside the
    vocabulary, as ``token_texts``."""
    ids = checked_ids(tokenizer, ids)
    vocab = whole_vocab(tokenizer)
    if vocab is None or not (vocab.state[ids] != 0).all():  # an id with no piece: as before
        return texts_array(token_texts(tokenizer, ids))
    out = _vocab_array(vocab).take(ids)
    spans = cut_texts(vocab, ids)
    if spans:
        mask = np.zeros(len(ids), bool)
        for start, texts in spans:
            mask[start:start + len(texts)] = True
        out = pc.replace_with_mask(out, pa.array(mask), texts_array(
            t for _, texts in spans for t in texts))
    return out


def joiner(text: pa.Array):
    """A function ``(start, stop) -> str``: the texts of tokens ``start``..``stop - 1`` of the
    Arrow string array ``text``, joined by one slice of its bytes (the tokens' texts lie one
    after the other there), no string made per token."""
    _, offsets, data = text.buffers()
    at = np.frombuffer(offsets, np.int64 if text.type == pa.large_string() else np.int32)
    at = at[text.offset:text.offset + len(text) + 1]
    data = memoryview(data if data is not None else b"")

    def joined(start: int, stop: int) -> str:
        return str(data[at[start]:at[stop]], "utf-8") if stop > start else ""
    return joined


@dataclass
class TokenColumns:
    """One trajectory's tokens: ``role`` codes into ``ROLES`` (trained = action), ``turn``
    (-1 the prompt), ``token_id`` (or None), ``text``, and per-token ``values``."""
    text: pa.Array
    role: np.ndarray
    turn: np.ndarray
    token_id: np.ndarray | None = None
    values: dict[str, np.ndarray] = field(default_factory=dict)
    present: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.role)

    @property
    def trained(self) -> np.ndarray:
        return self.role == ACTION

    def set_values(self, name: str, values, where: np.ndarray) -> None:
        """``values`` (one per ``where`` True position, or one per token) as ``name``."""
        out = np.zeros(len(self), np.float64)
        given = np.asarray(values, np.float64)
        if len(given) == len(self):
            given = given[where]
        out[where] = given
        self.values[name], self.present[name] = out, where.copy()

    def first(self, name: str) -> float | None:
        """``name`` of the first trained token that has it (the trajectory's advantage, under
        outcome estimators: every trained token gets the same value), else None."""
        if name not in self.values:
            return None
        hits = np.flatnonzero(self.present[name] & self.trained)
        return float(self.values[name][hits[0]]) if len(hits) else None

    def chars(self) -> int:
        """Text held, in UTF-8 bytes (at least its characters: a batch's bound,
        storage/token_rows.py ``BatchSize``), read from the array's offsets, not counted."""
        if not len(self.text):
            return 0
        at = np.frombuffer(self.text.buffers()[1], np.int64 if self.text.type == pa.large_string()
                           else np.int32)
        return int(at[self.text.offset + len(self.text)] - at[self.text.offset])

    def check(self, limit: int, slack: float) -> str | None:
        """None if every token is valid, else what storage/interchange.py says of the same
        tokens given as objects: over ``limit`` tokens; then the first token holding a value no
        double holds (NaN, +-inf: ``refuse_non_finite``'s message); then the first with a token
        id outside [0, 2^31) or a logprob above ``slack`` (``_check``'s). Kept logprobs up to
        ``slack`` become 0.0. Texts are strings by construction."""
        n = len(self)
        if n > limit:
            return f"field 'tokens' holds {n} entries, over the limit of {limit} per trajectory"
        with np.errstate(invalid="ignore"):
            at, name = _first({k: ~np.isfinite(v) & self.present[k]
                               for k, v in self.values.items()}, NON_FINITE_ORDER)
            if at is not None:
                return f"field 'tokens[{at}].{name}' must be a finite number (a double cannot " \
                       "hold it)"
            bad = {k: (v > slack) & self.present[k] for k, v in self.values.items()
                   if k in LOGPROBS}
        if self.token_id is not None:
            if self.token_id.dtype.kind not in "iu":  # a float or a boolean is no token id
                return f"field 'tokens' token ids must be integers, got {self.token_id.dtype}"
            bad["token_id"] = (self.token_id < 0) | (self.token_id >= 2**31)
        at, name = _first(bad, VALUE_ORDER)
        if at is None:
            for k in LOGPROBS:
                if k in self.values:
                    np.minimum(self.values[k], 0.0, out=self.values[k])
            return None
        where = f"tokens[{at}].{name}"
        if name == "token_id":
            return f"field '{where}' must be between 0 and 2^31-1, got {int(self.token_id[at])}"
        return (f"field '{where}' must be a log-probability (finite and <= 0), got "
                f"{float(self.values[name][at])!r}")

    def rows(self) -> list[dict]:
        """The rows as dicts (the general writers' path, storage/ingest/import_batch.py
        ``write_runs``): absent values left out, as a dict token leaves them out."""
        out = []
        ids = self.token_id.tolist() if self.token_id is not None else None
        texts, roles, turns = self.text.to_pylist(), self.role.tolist(), self.turn.tolist()
        values = {k: (v.tolist(), self.present[k].tolist()) for k, v in self.values.items()}
        for i in range(len(self)):
            row = {"text": texts[i], "role": ROLES[roles[i]], "trained": roles[i] == ACTION,
                   "turn": turns[i]}
            if ids is not None:
                row["token_id"] = ids[i]
            for name, (vals, given) in values.items():
                if given[i]:
                    row[name] = vals[i]
            out.append(row)
        return out


def tokens_table(items: list[tuple[str, int, "TokenColumns"]]) -> pa.Table:
    """The ``tokens`` table's rows (without ``run_id``) of several trajectories' columns
    ``(traj_id, step, columns)``: each column concatenated once for them all, so a batch's
    rows cost array copies, not Python work per trajectory. A value some trajectories lack
    is NULL on their rows."""
    sizes = np.array([len(c) for _, _, c in items], np.int64)
    n = int(sizes.sum())
    ids = pa.array([t for t, _, _ in items], pa.string())
    starts = np.cumsum(sizes) - sizes
    role = np.concatenate([c.role for _, _, c in items]) if items else np.zeros(0, np.int8)
    cols = {"traj_id": pa.DictionaryArray.from_arrays(
                pa.array(np.repeat(np.arange(len(items), dtype=np.int32), sizes)),
                ids).cast(pa.string()),
            "step": pa.array(np.repeat(np.array([s for _, s, _ in items], np.int32), sizes)),
            "pos": pa.array((np.arange(n, dtype=np.int64) - np.repeat(starts, sizes))
                            .astype(np.int32)),
            "text": pa.concat_arrays([c.text for _, _, c in items]) if items
            else pa.array([], pa.string()),
            "role": pa.DictionaryArray.from_arrays(pa.array(role), pa.array(ROLES))
            .cast(pa.string()),
            "turn": pa.array(np.concatenate([c.turn for _, _, c in items]).astype(np.int32)
                             if items else np.zeros(0, np.int32)),
            "trained": pa.array(role == ACTION)}
    if any(c.token_id is not None for _, _, c in items):
        cols["token_id"] = _joined([(c.token_id, None) for _, _, c in items], sizes, np.int32)
    for name in dict.fromkeys(k for _, _, c in items for k in c.values):
        cols[name] = _joined([(c.values.get(name), c.present.get(name)) for _, _, c in items],
                             sizes, np.float64)
    return pa.table(cols)


def _joined(parts: list, sizes: np.ndarray, dtype) -> pa.Array:
    """One Arrow column of ``parts`` ((values or None, where given or None: everywhere)), NULL
    where a part has no values or does not give one."""
    values = np.concatenate([np.zeros(k, dtype) if v is None else v.astype(dtype, copy=False)
                             for (v, _), k in zip(parts, sizes)])
    given = np.concatenate([np.zeros(k, bool) if v is None else
                            (np.ones(k, bool) if p is None else p)
                            for (v, p), k in zip(parts, sizes)])
    return pa.array(values, mask=~given)
