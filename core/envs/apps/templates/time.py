"""Apps task templates about the calendar and todos."""
from __future__ import annotations

from datetime import timedelta

from core.envs.apps.tasks import (Call, Template, at, day, is_insert, is_update_of, mail_to,
                                  next_day, person_params, pick_contacts, template)
from core.envs.apps.world import (EVENT_TITLES, LOCATIONS, TODO_LISTS, TODO_TITLES, fmt_time,
                                   parse_time)


def _event(world, title: str, start: str, minutes: int, location: str = "Room 4B",
           attendees: list[str] | None = None) -> int:
    end = fmt_time(parse_time(start) + timedelta(minutes=minutes))
    return world.store.insert("events", {"title": title, "start": start, "end": end,
                                         "location": location, "description": "",
                                         "attendees": attendees or []})


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


@template
class DinnerCheck(Template):
    """The seed's example: check tomorrow afternoon; if free, mail a friend and add the event."""
    name = "dinner_check"
    kind = "conditional"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        date = day(world.now, 1)
        lo, hi = at(date, "12:00"), at(date, "18:00")
        busy = world.store.rows("SELECT id FROM events WHERE start >= ? AND start < ?", (lo, hi))
        for row in busy:
            world.store.delete("events", row["id"])
        count = rng.choice((0, 0, 1, 2, 3))
        for start in sorted(rng.sample(range(12 * 60, 18 * 60, 30), count)):
            _event(world, rng.choice(EVENT_TITLES), at(date, _hhmm(start)), 30,
                   rng.choice(LOCATIONS))
        return {**person_params(c), "date": date, "count": count}

    def instruction(self, p):
        return (f"Check my calendar for meetings starting tomorrow afternoon (12:00 to 18:00). "
                f"If there are none, email {p['first']} {p['last']} to confirm our dinner "
                f"tomorrow at 19:00 (mention dinner in the subject) and add a calendar event "
                f"'Dinner with {p['first']}' tomorrow from 19:00 to 21:00. If there are meetings, "
                "change nothing and answer with how many there are.")

    def golds(self, p):
        return (str(p["count"]),) if p["count"] else ()

    def checks(self, p, final):
        if p["count"]:
            return []
        mails = [m for m in final.sent() if p["email"] in m["recipients"]
                 and "dinner" in m["subject"].lower()]
        start, end = at(p["date"], "19:00"), at(p["date"], "21:00")
        events = [e for e in final.inserted("events") if "dinner" in e["title"].lower()
                  and (e["start"], e["end"]) == (start, end)]
        return [(f"email_to_{p['first'].lower()}_sent", bool(mails), f"{len(mails)} mail(s)"),
                ("dinner_event_created", bool(events), f"{len(events)} event(s) {start}-{end}")]

    def allowed(self, p, e):
        if p["count"]:
            return False
        return mail_to(e, [p["email"]]) or (
            is_insert(e, "events") and e["after"]["start"].startswith(p["date"])
            and "dinner" in e["after"]["title"].lower())

    def plan(self, p):
        calls = [Call("calendar.search_events", {"start_after": at(p["date"], "12:00"),
                                                 "start_before": at(p["date"], "18:00"),
                                                 "limit": 10})]
        if p["count"]:
            return calls, str(p["count"])
        return calls + [
            Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
            Call("email.send_email", {"to": [p["email"]], "subject": "Dinner tomorrow",
                                      "body": f"Hi {p['first']}, confirming our dinner tomorrow "
                                              "at 19:00. See you then!"}),
            Call("calendar.create_event", {"title": f"Dinner with {p['first']}",
                                           "start": at(p["date"], "19:00"),
                                           "end": at(p["date"], "21:00")})], "done"


@template
class CompleteDueTodos(Template):
    name = "complete_due_todos"

    def plant(self, world, rng):
        name = rng.choice(TODO_LISTS)
        titles = rng.sample(TODO_TITLES, 4)
        today = world.now.replace(hour=0, minute=0)
        for title, days in zip(titles, (-rng.randrange(1, 4), 0, rng.randrange(1, 5), -1)):
            other = title == titles[3]  # a due todo in another list: must stay open
            world.store.insert("todos", {
                "title": title, "list_name": rng.choice([x for x in TODO_LISTS if x != name])
                if other else name, "due": fmt_time(today + timedelta(days=days, hours=17)),
                "priority": 2, "completed": 0, "completed_at": None})
        end = at(day(world.now), "23:59")
        due = world.store.rows("SELECT id FROM todos WHERE list_name = ? AND completed = 0 AND "
                               "due <= ? ORDER BY due, id", (name, end))
        return {"list_name": name, "date": day(world.now), "targets": [r["id"] for r in due]}

    def instruction(self, p):
        return (f"Mark every open todo in my '{p['list_name']}' list that is due today or "
                "earlier as completed. Leave the others alone.")

    def checks(self, p, final):
        out = []
        for key in p["targets"]:
            row = final.row("todos", key)
            out.append((f"todo_{key}_completed", bool(row) and row["completed"] == 1,
                        "completed" if row and row["completed"] else "still open"))
        return out

    def allowed(self, p, e):
        return is_update_of(e, "todos", p["targets"], {"completed", "completed_at"})

    def plan(self, p):
        calls = [Call("todo.list_todos", {"list_name": p["list_name"], "completed": False,
                                          "due_before": p["date"], "limit": 20})]
        return calls + [Call("todo.complete_todo", {"todo_id": k}) for k in p["targets"]], "done"


SPECIAL_TITLES = ("Roadmap review", "Hiring debrief", "Launch prep", "Offsite planning",
                  "Vendor demo")


@template
class RescheduleEvent(Template):
    name = "reschedule_event"

    def plant(self, world, rng):
        people = pick_contacts(world, rng, 2)
        title, date = rng.choice(SPECIAL_TITLES), day(world.now, rng.randrange(1, 7))
        start, minutes = rng.randrange(9 * 2, 14 * 2) * 30, rng.choice((30, 60, 90))
        new = start + 30 * rng.randrange(2, 7)
        key = _event(world, title, at(date, _hhmm(start)), minutes, rng.choice(LOCATIONS),
                     [c["email"] for c in people])
        return {"title": title, "date": date, "event_id": key, "new_start": _hhmm(new),
                "new_end": _hhmm(new + minutes),
                "attendees": [person_params(c) for c in people]}

    def instruction(self, p):
        return (f"Move my '{p['title']}' event on {p['date']} to start at {p['new_start']} the "
                "same day, keeping its length, and email every attendee about the new start time.")

    def checks(self, p, final):
        row = final.row("events", p["event_id"]) or {}
        want = (at(p["date"], p["new_start"]), at(p["date"], p["new_end"]))
        out = [("event_rescheduled", (row.get("start"), row.get("end")) == want,
                f"event is {row.get('start')} - {row.get('end')}")]
        for a in p["attendees"]:
            told = [m for m in final.sent() if a["email"] in m["recipients"]
                    and p["new_start"] in m["subject"] + " " + m["body"]]
            out.append((f"attendee_{a['first'].lower()}_notified", bool(told),
                        f"{len(told)} mail(s) mentioning {p['new_start']}"))
        return out

    def allowed(self, p, e):
        return (is_update_of(e, "events", [p["event_id"]], {"start", "end"})
                or mail_to(e, [a["email"] for a in p["attendees"]]))

    def plan(self, p):
        date, title = p["date"], p["title"]
        return [Call("calendar.search_events", {"query": title, "start_after": date,
                                                "start_before": next_day(date)}),
                Call("calendar.update_event", {"event_id": p["event_id"],
                                               "start": at(date, p["new_start"]),
                                               "end": at(date, p["new_end"])}),
                Call("email.send_email", {
                    "to": [a["email"] for a in p["attendees"]], "subject": f"New time: {title}",
                    "body": f"'{title}' on {date} now starts at {p['new_start']}."})], "done"


RECURRING = ("Pottery class", "Chess club", "Swim practice", "French lesson", "Board game night")


@template
class NextEventLocation(Template):
    name = "next_event_location"
    kind = "answer"

    def plant(self, world, rng):
        title = rng.choice(RECURRING)
        places = rng.sample(LOCATIONS, 4)
        offsets = [-rng.randrange(2, 9), rng.randrange(1, 4), rng.randrange(4, 8),
                   rng.randrange(8, 14)]
        for place, days in zip(places, offsets):
            start = (world.now + timedelta(days=days)).replace(hour=18, minute=30)
            _event(world, title, fmt_time(start), 60, place)
        return {"title": title, "now": fmt_time(world.now), "location": places[1]}

    def instruction(self, p):
        return f"Where is my next '{p['title']}' event? Answer with the location only."

    def golds(self, p):
        return (p["location"],)

    def plan(self, p):
        return [Call("calendar.search_events", {"query": p["title"], "start_after": p["now"]})], \
            p["location"]


@template
class CountEvents(Template):
    name = "count_events"
    kind = "answer"

    def plant(self, world, rng):
        date = day(world.now, rng.randrange(1, 8))
        for _ in range(rng.randrange(0, 3)):
            _event(world, rng.choice(EVENT_TITLES), at(date, _hhmm(30 * rng.randrange(16, 38))),
                   30, rng.choice(LOCATIONS))
        rows = world.store.rows("SELECT id FROM events WHERE start >= ? AND start < ?",
                                (at(date, "00:00"), at(next_day(date), "00:00")))
        weekday = parse_time(at(date, "00:00")).strftime("%A")
        return {"date": date, "weekday": weekday, "count": len(rows)}

    def instruction(self, p):
        return f"How many events do I have on {p['weekday']}, {p['date']}? Answer with a number."

    def golds(self, p):
        return (str(p["count"]),)

    def plan(self, p):
        nxt = next_day(p["date"])
        return [Call("calendar.search_events", {"start_after": p["date"], "start_before": nxt,
                                                "limit": 20})], str(p["count"])
