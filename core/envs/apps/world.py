"""The simulated world of the apps environment: schema, a change-logging store, and a seeded
generator of people, contacts, events, mails, notes, todos and wallet history.

Each episode owns a fresh in-memory SQLite database (sqlite3 from the standard library; only
storage/ may open DuckDB). Every write goes through ``Store.insert/update/delete``, which log
one ``{"table", "op", "key", "before", "after"}`` entry per row changed: the per-turn state diff
recorded for replay. Grading does not trust that log: it compares whole-database snapshots
(``Store.snapshot`` before and after, ``diff_snapshots``), so an unintended change is caught
however it was made.

Money is stored in integer cents (no float drift in sums); times are ``YYYY-MM-DD HH:MM``
strings in the world's own clock, so they sort as text and every write is stamped with the
simulated ``now``, never the wall clock: the same (task, seed) gives the same database.
"""
from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

TIME_FMT = "%Y-%m-%d %H:%M"

SCHEMA = {
    "contacts": "first_name TEXT, last_name TEXT, email TEXT, phone TEXT, relationship TEXT, "
                "birthday TEXT",
    "events": "title TEXT, start TEXT, end TEXT, location TEXT, description TEXT, "
              "attendees TEXT",
    "emails": "folder TEXT, sender TEXT, recipients TEXT, subject TEXT, body TEXT, "
              "sent_at TEXT, is_read INTEGER, starred INTEGER, in_reply_to INTEGER",
    "notes": "title TEXT, body TEXT, tags TEXT, created_at TEXT, updated_at TEXT",
    "todos": "title TEXT, list_name TEXT, due TEXT, priority INTEGER, completed INTEGER, "
             "completed_at TEXT",
    "wallet": "balance_cents INTEGER",
    "transactions": "counterparty TEXT, amount_cents INTEGER, description TEXT, created_at TEXT",
    "payment_requests": "requester TEXT, payer TEXT, amount_cents INTEGER, description TEXT, "
                        "status TEXT, created_at TEXT",
}
JSON_COLUMNS = {"attendees", "recipients", "tags"}
"""Columns holding JSON lists; rows expose them decoded."""


def fmt_time(t: datetime) -> str:
    return t.strftime(TIME_FMT)


def parse_time(text: str) -> datetime:
    return datetime.strptime(text, TIME_FMT)


def dollars(cents: int) -> float:
    return round(cents / 100.0, 2)


# ---- store -------------------------------------------------------------------------------------
class Store:
    """One episode's database. Reads are plain SQL; writes log a row-level diff entry each."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:")
        self.conn.row_factory = sqlite3.Row
        for table, cols in SCHEMA.items():
            self.conn.execute(f"CREATE TABLE {table} "
                              f"(id INTEGER PRIMARY KEY AUTOINCREMENT, {cols})")
        self.log: list[dict[str, Any]] = []

    @staticmethod
    def _decode(row: sqlite3.Row) -> dict[str, Any]:
        out = dict(row)
        for col in JSON_COLUMNS & out.keys():
            out[col] = json.loads(out[col]) if out[col] is not None else []
        return out

    @staticmethod
    def _encode(values: dict[str, Any]) -> dict[str, Any]:
        return {k: json.dumps(v) if k in JSON_COLUMNS else v for k, v in values.items()}

    def rows(self, sql: str, params: tuple | list = ()) -> list[dict[str, Any]]:
        return [self._decode(r) for r in self.conn.execute(sql, params).fetchall()]

    def get(self, table: str, key: int) -> dict[str, Any] | None:
        found = self.rows(f"SELECT * FROM {table} WHERE id = ?", (key,))
        return found[0] if found else None

    def insert(self, table: str, values: dict[str, Any]) -> int:
        enc = self._encode(values)
        cols = ", ".join(enc)
        marks = ", ".join("?" for _ in enc)
        cur = self.conn.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})",
                                tuple(enc.values()))
        key = int(cur.lastrowid)
        self.log.append({"table": table, "op": "insert", "key": key, "before": None,
                         "after": self.get(table, key)})
        return key

    def update(self, table: str, key: int, values: dict[str, Any]) -> dict[str, Any]:
        before = self.get(table, key)
        if before is None:
            raise KeyError(f"{table} has no row {key}")
        enc = self._encode(values)
        sets = ", ".join(f"{c} = ?" for c in enc)
        self.conn.execute(f"UPDATE {table} SET {sets} WHERE id = ?", (*enc.values(), key))
        after = self.get(table, key)
        if after != before:  # a no-op update changes nothing and is not a diff
            self.log.append({"table": table, "op": "update", "key": key, "before": before,
                             "after": after})
        return after

    def delete(self, table: str, key: int) -> None:
        before = self.get(table, key)
        if before is None:
            raise KeyError(f"{table} has no row {key}")
        self.conn.execute(f"DELETE FROM {table} WHERE id = ?", (key,))
        self.log.append({"table": table, "op": "delete", "key": key, "before": before,
                         "after": None})

    def snapshot(self) -> dict[str, dict[int, dict[str, Any]]]:
        return {t: {r["id"]: r for r in self.rows(f"SELECT * FROM {t}")} for t in SCHEMA}


def diff_snapshots(before: dict, after: dict) -> list[dict[str, Any]]:
    """Every row that differs between two snapshots, as insert/update/delete entries."""
    out = []
    for table in SCHEMA:
        old, new = before.get(table, {}), after.get(table, {})
        for key in sorted(old.keys() | new.keys()):
            a, b = old.get(key), new.get(key)
            if a == b:
                continue
            op = "insert" if a is None else "delete" if b is None else "update"
            out.append({"table": table, "op": op, "key": key, "before": a, "after": b})
    return out


# ---- vocabulary --------------------------------------------------------------------------------
FIRST_NAMES = (
    "Alex Sam Jordan Taylor Morgan Casey Riley Jamie Avery Quinn Drew Parker Rowan Emery Hayden "
    "Maya Noah Liam Emma Olivia Ava Mia Lucas Ethan Zoe Chloe Leo Nora Ivy Owen Ruby Felix Hugo "
    "Iris Clara Theo Jade Milo Lena Omar Priya Ravi Mei Kenji Sofia Diego Amara Yusuf Elena Marco "
    "Hana Tariq Greta Lars Ines Paulo Anya Dmitri Fatima Kofi Aisha Bruno Carmen Dario Esme "
    "Farid Gemma Hector Ingrid Jonas Keira Luca Mateo Nadia Oscar Pia Rafael Selma Tomas Uma "
    "Viktor Wanda Xavier Yara Zane Beatrix Cyrus Delia Emil Flora"
).split()
LAST_NAMES = (
    "Kim Patel Garcia Nguyen Smith Johnson Lee Brown Martin Rossi Muller Silva Cohen Okafor Ivanov "
    "Tanaka Haddad Novak Larsen Costa Reyes Walsh Becker Moreau Singh Chen Park Dubois Kowalski Ali"
).split()
DOMAINS = ("mail.test", "inbox.test", "post.test", "work.test")
RELATIONSHIPS = ("friend", "family", "coworker", "manager", "neighbor", "classmate")
LOCATIONS = ("Room 4B", "Cafe Lumen", "Main Office", "City Gym", "Library", "Video call",
             "Harbor Park", "Clinic on 5th", "Town Hall", "Studio 2")
EVENT_TITLES = ("Team sync", "Project review", "Budget planning", "Yoga class", "Dentist",
                "Book club", "Design critique", "Quarterly planning", "Guitar lesson",
                "Standup", "Client call", "Volunteer shift")
SUBJECTS = ("Quick question", "Weekend plans", "Photos from the trip", "Invoice attached",
            "Meeting notes", "Recipe you asked for", "Re: schedule", "Happy birthday!",
            "Reading list", "Car pool tomorrow?", "Thanks!", "Update on the report")
SENTENCES = ("Let me know what you think.", "Hope you are well.", "See you soon.",
             "Can we talk about this next week?", "I attached the details.",
             "Thanks again for your help.", "No rush on this one.", "Talk later!")
NOTE_TITLES = ("Grocery list", "Book recommendations", "Gift ideas", "Trip packing",
               "Workout plan", "Movie watchlist", "Garden plans", "Password hints (fake)")
TODO_TITLES = ("Renew library card", "Call the plumber", "Buy printer ink", "Water plants",
               "Submit expense report", "Book flights", "Return jacket", "Schedule haircut",
               "Update resume", "Clean garage", "Pay parking ticket", "Back up laptop")
TODO_LISTS = ("personal", "work", "errands")
PAY_REASONS = ("dinner", "concert tickets", "groceries", "taxi", "birthday gift", "rent share",
               "coffee", "museum tickets", "pizza night", "books")


@dataclass
class World:
    """A generated world: its store, clock, user and simulated people."""
    store: Store
    now: datetime
    me: dict[str, str]
    people: list[dict[str, str]]
    """Everyone the user knows of (first, last, email, phone); most are contacts."""
    rng: random.Random = field(repr=False, default_factory=random.Random)

    def person(self, first: str) -> dict[str, str]:
        return next(p for p in self.people if p["first"] == first)

    def contact_of(self, first: str) -> dict[str, Any] | None:
        found = self.store.rows("SELECT * FROM contacts WHERE first_name = ?", (first,))
        return found[0] if found else None


# ---- generator ---------------------------------------------------------------------------------
def _person(rng: random.Random, first: str) -> dict[str, str]:
    last = rng.choice(LAST_NAMES)
    return {"first": first, "last": last,
            "email": f"{first}.{last}@{rng.choice(DOMAINS)}".lower(),
            "phone": f"555-{rng.randrange(100, 1000)}-{rng.randrange(1000, 10000)}"}


def _at(rng: random.Random, day: datetime, lo_hour: int = 8, hi_hour: int = 19) -> datetime:
    return day.replace(hour=rng.randrange(lo_hour, hi_hour), minute=rng.choice((0, 30)))


def generate_world(seed: int) -> World:
    """A fresh world from ``seed``: 30-60 people, ~80% of them contacts, a calendar from 10 days
    ago to 14 days ahead, 40-60 mails, notes, todos, wallet history over ~4 months. Each app is
    filled in turn from the one ``rng``, so the order of the calls below is part of the world."""
    rng = random.Random(seed)
    now = datetime(2024, 1, 8, 9, 0) + timedelta(days=rng.randrange(0, 330),
                                                 minutes=30 * rng.randrange(0, 8))
    names = rng.sample(FIRST_NAMES, rng.randrange(30, 61) + 1)
    me = _person(rng, names.pop())
    me = {"first": me["first"], "last": me["last"], "email": me["email"]}
    people = [_person(rng, n) for n in names]
    store = Store()
    world = World(store, now, me, people, rng)
    today = now.replace(hour=0, minute=0)
    _contacts(rng, store, people)
    _calendar(rng, store, people, today)
    _mail(rng, store, people, me, now)
    _notes(rng, store, now)
    _todos(rng, store, now, today)
    _wallet(rng, store, people, me, now)
    store.log.clear()  # generation is not part of any episode's diff
    return world


def _contacts(rng: random.Random, store: Store, people: list) -> None:
    for p in people:
        if rng.random() < 0.8:
            bday = datetime(1960 + rng.randrange(45), 1, 1) + timedelta(days=rng.randrange(365))
            store.insert("contacts", {"first_name": p["first"], "last_name": p["last"],
                                      "email": p["email"], "phone": p["phone"],
                                      "relationship": rng.choice(RELATIONSHIPS),
                                      "birthday": bday.strftime("%Y-%m-%d")})


def _calendar(rng: random.Random, store: Store, people: list, today: datetime) -> None:
    for _ in range(rng.randrange(20, 31)):
        start = _at(rng, today + timedelta(days=rng.randrange(-10, 15)))
        who = rng.sample(people, rng.randrange(0, 4))
        store.insert("events", {
            "title": rng.choice(EVENT_TITLES), "start": fmt_time(start),
            "end": fmt_time(start + timedelta(minutes=rng.choice((30, 60, 90)))),
            "location": rng.choice(LOCATIONS), "description": "",
            "attendees": [p["email"] for p in who]})


def _mail(rng: random.Random, store: Store, people: list, me: dict, now: datetime) -> None:
    for _ in range(rng.randrange(40, 61)):
        p = rng.choice(people)
        sent = now - timedelta(minutes=rng.randrange(30, 60 * 24 * 30))
        outgoing = rng.random() < 0.25
        store.insert("emails", {
            "folder": "sent" if outgoing else rng.choice(("inbox",) * 4 + ("archive",)),
            "sender": me["email"] if outgoing else p["email"],
            "recipients": [p["email"]] if outgoing else [me["email"]],
            "subject": rng.choice(SUBJECTS),
            "body": f"Hi {me['first'] if not outgoing else p['first']}, "
                    + " ".join(rng.sample(SENTENCES, 2)),
            "sent_at": fmt_time(sent), "is_read": int(outgoing or rng.random() < 0.7),
            "starred": int(rng.random() < 0.1), "in_reply_to": None})


def _notes(rng: random.Random, store: Store, now: datetime) -> None:
    for title in rng.sample(NOTE_TITLES, rng.randrange(4, 8)):
        made = fmt_time(now - timedelta(days=rng.randrange(1, 90)))
        store.insert("notes", {"title": title, "body": f"{title}: " + rng.choice(SENTENCES),
                               "tags": rng.sample(["home", "work", "ideas", "misc"], 1),
                               "created_at": made, "updated_at": made})


def _todos(rng: random.Random, store: Store, now: datetime, today: datetime) -> None:
    for title in rng.sample(TODO_TITLES, rng.randrange(6, 11)):
        done = rng.random() < 0.3
        due = today + timedelta(days=rng.randrange(-5, 10), hours=rng.choice((9, 12, 17)))
        store.insert("todos", {"title": title, "list_name": rng.choice(TODO_LISTS),
                               "due": fmt_time(due), "priority": rng.randrange(1, 4),
                               "completed": int(done),
                               "completed_at": fmt_time(now - timedelta(hours=3)) if done
                               else None})


def _wallet(rng: random.Random, store: Store, people: list, me: dict, now: datetime) -> None:
    store.insert("wallet", {"balance_cents": rng.randrange(800_00, 3000_00)})
    for _ in range(rng.randrange(25, 41)):
        p = rng.choice(people)
        cents = rng.randrange(5_00, 120_00)
        store.insert("transactions", {
            "counterparty": p["email"], "amount_cents": cents if rng.random() < 0.35 else -cents,
            "description": rng.choice(PAY_REASONS),
            "created_at": fmt_time(now - timedelta(minutes=rng.randrange(60, 60 * 24 * 120)))})
    for _ in range(rng.randrange(3, 7)):
        p = rng.choice(people)
        incoming = rng.random() < 0.5
        store.insert("payment_requests", {
            "requester": p["email"] if incoming else me["email"],
            "payer": me["email"] if incoming else p["email"],
            "amount_cents": rng.randrange(5_00, 90_00), "description": rng.choice(PAY_REASONS),
            "status": rng.choice(("paid", "declined", "pending")),
            "created_at": fmt_time(now - timedelta(days=rng.randrange(2, 40)))})
