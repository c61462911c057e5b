"""An imported trajectory's token rows, bounded and made only when they are written.

Why not a list of row dicts: a row dict costs about 640 bytes, so an assistant message of 3.9M
characters of ``"a "`` (a 23 KB ``.eval``) rebuilt into 1.95M whitespace pieces took 1.25 GB
before anything was written. Here a trajectory keeps its text (which its turns hold anyway) or
the tokens it was given, and ``TokenRows`` yields the rows when storage/ingest/import_batch.py
streams them into the store, ``ROW_CHUNK`` at a time.

The caps (docs/threat-model.md states what they bound, with the figures measured):

* ``MAX_TEXT_TOKENS`` rows per text: a prompt, an action or an observation rebuilt from its
  words gives at most this many whitespace pieces; the rest of the text is the last row, whole,
  so the rows still concatenate to the text (nothing is dropped: the text is tokenised
  coarser). The cut is recorded in the trajectory's ``info.token_rows_cut`` (turn, role, the
  characters in that last row) and its ``import_notes``, as the trainer records an observation
  it cut (``observation_cut_bytes``).
* ``MAX_TRAJECTORY_TOKENS`` rows per trajectory: past it, each further text is one row. Given
  tokens (a generic JSONL line's ``tokens``: the model's own, with logprobs, which cannot be
  merged) beyond it fail the line, naming the count.
* Per batch, ``MAX_BATCH_TOKENS`` rows or ``MAX_BATCH_CHARS`` characters of text held
  (``BatchSize``): the importers write a batch once it reaches either.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, Iterator

MAX_TEXT_TOKENS = 32_768
MAX_TRAJECTORY_TOKENS = 131_072
MAX_BATCH_TOKENS = 500_000
MAX_BATCH_CHARS = 8 << 20
ROW_CHUNK = 50_000
"""Token rows built and inserted at a time (storage/ingest/import_batch.py)."""
PIECE = re.compile(r"\s*\S+|\s+")


def pieces(text: str) -> list[str]:
    """Whitespace-led pieces whose concatenation is exactly ``text``."""
    return PIECE.findall(text)


def capped_pieces(text: str, rows: int) -> Iterator[str]:
    """The whitespace pieces of ``text``, the ``rows``-th holding the rest of the text whole."""
    for i, match in enumerate(PIECE.finditer(text)):
        if i == rows - 1:
            yield text[match.start():]
            return
        yield match.group()


def _rows_of(text: str, allowed: int) -> tuple[int, int]:
    """(rows ``text`` gives with at most ``allowed``, characters in a last row that holds the
    rest: 0 when nothing was merged). Looks at no more than ``allowed + 1`` pieces."""
    starts = [m.start() for m in islice(PIECE.finditer(text), allowed + 1)]
    if len(starts) <= allowed:
        return len(starts), 0
    return allowed, len(text) - starts[allowed - 1]


@dataclass
class Segment:
    """One text of the trajectory, rebuilt into ``rows`` rows."""
    text: str
    role: str
    turn: int
    rows: int


@dataclass
class TokenRows:
    """The ``tokens`` rows of one trajectory (``traj_id``, ``step``, ``pos`` and each token's
    fields), made on each iteration. ``given``: the tokens the record came with (validated
    dicts), or ``columns`` (a trainer's rollout, storage/token_columns.py, written as Arrow
    tables), else ``segments`` rebuilt from its text. ``fixed``: values every row takes (an
    evaluation log's ``trained`` False). ``advantage``: a rebuilt trained row's."""
    traj_id: str
    step: int
    given: list[dict] | None = None
    segments: list[Segment] = field(default_factory=list)
    advantage: float | None = None
    fixed: dict[str, Any] = field(default_factory=dict)
    cuts: list[dict] = field(default_factory=list)
    columns: Any = None

    @classmethod
    def rebuilt(cls, traj_id: str, step: int, texts: list[tuple[str, str, int]],
                advantage: float | None) -> "TokenRows":
        """Rows of ``texts`` ((text, role, turn) in order), capped (module docstring)."""
        out, total = cls(traj_id, step, advantage=advantage), 0
        for text, role, turn in texts:
            if not text:
                continue
            allowed = min(MAX_TEXT_TOKENS, max(MAX_TRAJECTORY_TOKENS - total, 1))
            rows, merged = _rows_of(text, allowed)
            if merged:
                out.cuts.append({"turn": turn, "role": role, "rows": rows, "chars": merged})
            out.segments.append(Segment(text, role, turn, rows))
            total += rows
        return out

    def __len__(self) -> int:
        if self.columns is not None:
            return len(self.columns)
        return len(self.given) if self.given is not None else sum(s.rows for s in self.segments)

    @property
    def chars(self) -> int:
        """Characters of text this trajectory holds for its rows (a batch's bound)."""
        if self.columns is not None:
            return self.columns.chars()
        if self.given is not None:
            return sum(len(t["text"]) for t in self.given)
        return sum(len(s.text) for s in self.segments)

    def trained(self) -> int:
        """How many rows are trained (the trajectory's ``response_tokens``)."""
        if "trained" in self.fixed:
            return len(self) if self.fixed["trained"] is True else 0
        if self.columns is not None:
            return int(self.columns.trained.sum())
        if self.given is not None:
            return sum(1 for t in self.given if t.get("trained", t["role"] == "action"))
        return sum(s.rows for s in self.segments if s.role == "action")

    def __iter__(self) -> Iterator[dict]:
        base = {"traj_id": self.traj_id, "step": self.step}
        given = self.columns.rows() if self.columns is not None else self.given
        if given is not None:
            for pos, tok in enumerate(given):
                yield {**base, "pos": pos, **tok,
                       "trained": tok.get("trained", tok["role"] == "action"), **self.fixed}
            return
        pos = 0
        for s in self.segments:
            trained = s.role == "action"
            extra = {"advantage": self.advantage} if trained and self.advantage is not None \
                else {}
            for text in capped_pieces(s.text, s.rows):
                yield {**base, "pos": pos, "text": text, "role": s.role, "turn": s.turn,
                       "trained": trained, **extra, **self.fixed}
                pos += 1


@dataclass
class BatchSize:
    """What a batch of trajectories read but not yet written holds: ``full()`` once it has
    ``records`` of them, ``MAX_BATCH_TOKENS`` token rows or ``MAX_BATCH_CHARS`` of their text."""
    records: int
    count: int = 0
    tokens: int = 0
    chars: int = 0

    def add(self, rows: dict) -> None:
        self.count += 1
        self.tokens += len(rows["tokens"])
        self.chars += rows["tokens"].chars

    def full(self) -> bool:
        return self.count >= self.records or self.tokens >= MAX_BATCH_TOKENS \
            or self.chars >= MAX_BATCH_CHARS

    def clear(self) -> None:
        self.count = self.tokens = self.chars = 0
