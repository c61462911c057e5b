"""What core/serve/server.py injects and observes: fault rules consumed per request (see that
module's docstring), and a bounded record of the requests it saw, those it cut short, and how
many are in flight.
"""
from __future__ import annotations

import threading

SEEN_MAX, SEEN_BYTES = 1000, 16 << 20
"""``FaultPlan.seen`` keeps the latest requests only: at most this many, whose bodies sum to at
most this many bytes."""


class FaultPlan:
    """The fault rules, consumed thread-safely (core/serve/server.py's docstring), and what
    the server saw: ``seen`` (bounded by SEEN_MAX and SEEN_BYTES), ``stopped``, ``in_flight``."""

    def __init__(self, rules: list[dict] | None = None):
        self.lock = threading.Lock()
        self.rules = [dict(r) for r in rules or []]
        self.seen: list[dict] = []
        """The latest requests: their fault (or None), whether they carried the key (never the
        key), seed, messages (None when unread or not valid) and body size in ``bytes``."""
        self.stopped: list[dict] = []
        """The latest requests cut short: ``reason`` (client_gone | deadline),
        ``completion_tokens`` generated, ``max_tokens`` asked (at most SEEN_MAX kept)."""
        self.in_flight = self.most_in_flight = 0
        """Chat requests being answered now, and the most there ever were at once."""
        # the list whose bodies _bytes sums: tests replace seen between runs
        self._counted, self._bytes = None, 0

    def enter(self, delta: int) -> None:
        with self.lock:
            self.in_flight += delta
            self.most_in_flight = max(self.most_in_flight, self.in_flight)

    def take(self, body_text: str) -> dict | None:
        with self.lock:
            for rule in self.rules:
                if rule.get("times", 1) != 0 and rule.get("when", "") in body_text:
                    if rule.get("times", 1) > 0:
                        rule["times"] = rule.get("times", 1) - 1
                    return rule
        return None

    def record(self, entry: dict) -> None:
        """Keep ``entry`` in ``seen``, dropping the oldest past SEEN_MAX entries or SEEN_BYTES."""
        with self.lock:
            if self._counted is not self.seen:
                self._counted, self._bytes = self.seen, sum(e.get("bytes", 0) for e in self.seen)
            self.seen.append(entry)
            self._bytes += entry.get("bytes", 0)
            while len(self.seen) > 1 and (len(self.seen) > SEEN_MAX or self._bytes > SEEN_BYTES):
                self._bytes -= self.seen.pop(0).get("bytes", 0)
            if self._bytes > SEEN_BYTES:  # one body alone over the bound: keep the fact only
                entry["messages"], self._bytes = None, 0

    def cut_short(self, entry: dict) -> None:
        with self.lock:
            self.stopped.append(entry)
            del self.stopped[:-SEEN_MAX]
