"""Task templates of the apps environment and the unit-test grader (AppWorld/LOOP style).

A ``Template`` owns everything about one kind of task:
  plant(world, rng) -> params   make the generated world fit the task (the person exists, the
                                afternoon is free or busy, the request is pending ...) and return
                                the parameters (JSON-able, stored in Task.meta)
  instruction(params)           the user's request
  golds(params)                 answers that count as correct; () when no answer is required
  checks(params, final)         unit tests on the final state: (name, passed, detail)
  allowed(params, entry)        whether one changed row is something the task asked for
  plan(params)                  the scripted expert's API calls, then its answer

``grade`` runs a template's checks, the answer test when golds exist, and the collateral-damage
test: the final database is diffed against the initial one and every changed row must be
``allowed`` — the task's own writes pass, anything else (an extra deletion, a mail to the wrong
person, marking mail read) fails ``no_collateral_damage``. Templates are registered in
``TEMPLATES`` by the modules of ``templates/``.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from core.envs.apps.world import World, diff_snapshots, fmt_time, generate_world
from core.envs.answers import exact_match

ANSWER_TEST = "answer_matches"
COLLATERAL_TEST = "no_collateral_damage"


def rng_of(*parts: Any) -> random.Random:
    """A Random seeded from the parts' text, stable across Python runs (unlike hash())."""
    return random.Random(hashlib.sha256("/".join(map(str, parts)).encode()).digest())


@dataclass(frozen=True)
class Call:
    """One API call of an expert plan."""
    name: str
    arguments: dict[str, Any]

    @property
    def app(self) -> str:
        return self.name.split(".", 1)[0]


@dataclass
class Final:
    """What a grader sees: the diff from the initial state and the final snapshot."""
    diff: list[dict[str, Any]]
    after: dict[str, dict[int, dict[str, Any]]]

    def inserted(self, table: str) -> list[dict[str, Any]]:
        return [e["after"] for e in self.diff if e["table"] == table and e["op"] == "insert"]

    def row(self, table: str, key: int) -> dict[str, Any] | None:
        return self.after[table].get(key)

    def sent(self) -> list[dict[str, Any]]:
        """Mails the user sent during the episode."""
        return [m for m in self.inserted("emails") if m["folder"] == "sent"]


def changed_columns(entry: dict[str, Any]) -> set[str]:
    """Columns an update entry changed (all columns for inserts/deletes)."""
    before, after = entry["before"] or {}, entry["after"] or {}
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def is_update_of(entry: dict, table: str, keys, columns: set[str]) -> bool:
    """entry updates a row of table whose id is in keys, touching only these columns."""
    return (entry["table"] == table and entry["op"] == "update" and entry["key"] in set(keys)
            and changed_columns(entry) <= columns)


def is_insert(entry: dict, table: str) -> bool:
    return entry["table"] == table and entry["op"] == "insert"


def mail_to(entry: dict, allowed_recipients) -> bool:
    """entry inserts a sent mail whose recipients are all among allowed_recipients."""
    return (is_insert(entry, "emails") and entry["after"]["folder"] == "sent"
            and set(entry["after"]["recipients"]) <= set(allowed_recipients))


def money_golds(cents: int) -> tuple[str, ...]:
    """'45.50' and '45.5' (and '45' for whole dollars): answer normalisation drops the dot, so
    each way of writing the amount needs its own gold."""
    text = f"{cents / 100:.2f}"
    out = [text, text.rstrip("0")]
    if cents % 100 == 0:
        out.append(str(cents // 100))
    return tuple(dict.fromkeys(s.rstrip(".") for s in out))


def day(t: datetime, days: int = 0) -> str:
    return (t + timedelta(days=days)).strftime("%Y-%m-%d")


def next_day(date: str) -> str:
    """'2024-03-31' -> '2024-04-01'."""
    return day(datetime.strptime(date, "%Y-%m-%d"), 1)


def at(date: str, hhmm: str) -> str:
    return f"{date} {hhmm}"


def pick_contacts(world: World, rng: random.Random, k: int = 1) -> list[dict[str, Any]]:
    rows = world.store.rows("SELECT * FROM contacts ORDER BY id")
    return rng.sample(rows, k)


def person_params(contact: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    return {f"{prefix}first": contact["first_name"], f"{prefix}last": contact["last_name"],
            f"{prefix}email": contact["email"], f"{prefix}contact_id": contact["id"]}


class Template:
    """Base class; see the module docstring for the contract."""
    name = ""
    kind = "change"
    """change (state changes required) | answer | conditional, for reports."""

    def plant(self, world: World, rng: random.Random) -> dict[str, Any]:
        raise NotImplementedError

    def instruction(self, p: dict[str, Any]) -> str:
        raise NotImplementedError

    def golds(self, p: dict[str, Any]) -> tuple[str, ...]:
        return ()

    def checks(self, p: dict[str, Any], final: Final) -> list[tuple[str, bool, str]]:
        return []

    def allowed(self, p: dict[str, Any], entry: dict[str, Any]) -> bool:
        return False

    def plan(self, p: dict[str, Any]) -> tuple[list[Call], str]:
        raise NotImplementedError


TEMPLATES: dict[str, Template] = {}


def template(cls):
    """Class decorator: register one instance of a Template subclass under cls.name."""
    TEMPLATES[cls.name] = cls()
    return cls


# ---- building and grading ------------------------------------------------------------------------
def build(template_name: str, world_seed: int) -> tuple[World, dict[str, Any]]:
    """The task's world (generated, then planted) and its parameters; deterministic."""
    world = generate_world(world_seed)
    params = TEMPLATES[template_name].plant(world, rng_of("plant", template_name, world_seed))
    world.store.log.clear()
    return world, params


def grade(template_name: str, params: dict[str, Any], golds: tuple[str, ...],
          initial: dict, final_snapshot: dict, answer: str | None) -> list[tuple[str, bool, str]]:
    """Every unit test of the task on the final state, in a stable order."""
    tpl = TEMPLATES[template_name]
    final = Final(diff_snapshots(initial, final_snapshot), final_snapshot)
    tests = list(tpl.checks(params, final))
    if golds:
        ok = exact_match(answer, list(golds)) == 1.0
        tests.append((ANSWER_TEST, ok, f"answer {answer!r:.80}, expected {golds[0]!r}"))
    stray = [e for e in final.diff if not tpl.allowed(params, e)]
    detail = ", ".join(f"{e['op']} {e['table']}#{e['key']}" for e in stray[:5]) or "none"
    tests.append((COLLATERAL_TEST, not stray, f"unrequested changes: {detail}"))
    return tests


def stamp(world: World, minutes_ago: int) -> str:
    return fmt_time(world.now - timedelta(minutes=minutes_ago))
