"""Endpoints of the calendar, notes and todo apps (see mail.py)."""
from __future__ import annotations

from typing import Any

from core.envs.apps.api import ApiError, as_email, as_time, endpoint, found, like, limit_of, opt, req
from core.envs.apps.world import World, fmt_time


# ---- calendar ------------------------------------------------------------------------------------
def _event(world: World, key: int) -> dict:
    return found(world.store.get("events", key), "event", key)


@endpoint("calendar.search_events", "Events by text and start time, earliest first.",
          opt("query", "string", "Text in title, location or description."),
          opt("start_after", "string", "Only events starting at or after this time "
              "('YYYY-MM-DD' or 'YYYY-MM-DD HH:MM')."),
          opt("start_before", "string", "Only events starting before this time."),
          opt("attendee", "string", "Only events with this attendee email."),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of events")
def search_events(world, query, start_after, start_before, attendee, limit):
    sql = ("SELECT * FROM events WHERE lower(title || ' ' || location || ' ' || description) "
           "LIKE ?")
    params: list[Any] = [like(query)]
    if start_after is not None:
        sql += " AND start >= ?"
        params.append(as_time(start_after, "start_after"))
    if start_before is not None:
        sql += " AND start < ?"
        params.append(as_time(start_before, "start_before"))
    if attendee is not None:
        sql += " AND attendees LIKE ?"
        params.append(f'%"{attendee.strip().lower()}"%')
    return world.store.rows(sql + " ORDER BY start, id LIMIT ?", (*params, limit_of(limit)))


@endpoint("calendar.show_event", "One event by id.", req("event_id", "integer", "Event id."),
          returns="event")
def show_event(world, event_id):
    return _event(world, event_id)


def _check_span(start: str, end: str) -> None:
    if end <= start:
        raise ApiError(f"an event must end after it starts (start {start}, end {end})")


@endpoint("calendar.create_event", "Create an event.", req("title", "string", "Title."),
          req("start", "string", "Start, 'YYYY-MM-DD HH:MM'."),
          req("end", "string", "End, 'YYYY-MM-DD HH:MM'."), opt("location", "string", "Place.", ""),
          opt("description", "string", "Details.", ""),
          opt("attendees", "array", "Attendee emails.", []), returns="the new event", mutates=True)
def create_event(world, title, start, end, location, description, attendees):
    start, end = as_time(start, "start"), as_time(end, "end")
    _check_span(start, end)
    key = world.store.insert("events", {
        "title": title.strip(), "start": start, "end": end, "location": location,
        "description": description, "attendees": [as_email(a, "attendees") for a in attendees]})
    return world.store.get("events", key)


@endpoint("calendar.update_event", "Change some fields of an event.",
          req("event_id", "integer", "Event id."), opt("title", "string", "New title."),
          opt("start", "string", "New start."), opt("end", "string", "New end."),
          opt("location", "string", "New place."), opt("description", "string", "New details."),
          returns="the updated event", mutates=True)
def update_event(world, event_id, **fields):
    event = _event(world, event_id)
    changes = {k: v for k, v in fields.items() if v is not None}
    for k in ("start", "end"):
        if k in changes:
            changes[k] = as_time(changes[k], k)
    if not changes:
        raise ApiError("calendar.update_event: give at least one field to change")
    _check_span(changes.get("start", event["start"]), changes.get("end", event["end"]))
    return world.store.update("events", event_id, changes)


@endpoint("calendar.delete_event", "Delete an event.", req("event_id", "integer", "Event id."),
          returns="{deleted: id}", mutates=True)
def delete_event(world, event_id):
    _event(world, event_id)
    world.store.delete("events", event_id)
    return {"deleted": event_id}


@endpoint("calendar.add_attendee", "Invite someone to an event.",
          req("event_id", "integer", "Event id."), req("email", "string", "Attendee email."),
          returns="the updated event", mutates=True)
def add_attendee(world, event_id, email):
    people = _event(world, event_id)["attendees"]
    email = as_email(email, "email")
    if email in people:
        raise ApiError(f"{email} already attends event {event_id}")
    return world.store.update("events", event_id, {"attendees": people + [email]})


@endpoint("calendar.remove_attendee", "Remove an attendee from an event.",
          req("event_id", "integer", "Event id."), req("email", "string", "Attendee email."),
          returns="the updated event", mutates=True)
def remove_attendee(world, event_id, email):
    people = _event(world, event_id)["attendees"]
    email = as_email(email, "email")
    if email not in people:
        raise ApiError(f"{email} does not attend event {event_id}")
    return world.store.update("events", event_id, {"attendees": [p for p in people if p != email]})


# ---- notes ---------------------------------------------------------------------------------------
@endpoint("notes.search_notes", "Notes by text and tag, newest first.",
          opt("query", "string", "Text in title or body."), opt("tag", "string", "Only this tag."),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of notes")
def search_notes(world, query, tag, limit):
    sql = "SELECT * FROM notes WHERE lower(title || ' ' || body) LIKE ?"
    params: list[Any] = [like(query)]
    if tag is not None:
        sql += " AND tags LIKE ?"
        params.append(f'%"{tag.strip()}"%')
    return world.store.rows(sql + " ORDER BY updated_at DESC, id DESC LIMIT ?",
                            (*params, limit_of(limit)))


@endpoint("notes.show_note", "One note by id.", req("note_id", "integer", "Note id."),
          returns="note")
def show_note(world, note_id):
    return found(world.store.get("notes", note_id), "note", note_id)


@endpoint("notes.create_note", "Write a new note.", req("title", "string", "Title."),
          req("body", "string", "Text."), opt("tags", "array", "Tags.", []),
          returns="the new note", mutates=True)
def create_note(world, title, body, tags):
    now = fmt_time(world.now)
    key = world.store.insert("notes", {"title": title.strip(), "body": body, "tags": tags,
                                       "created_at": now, "updated_at": now})
    return world.store.get("notes", key)


@endpoint("notes.update_note", "Change a note.", req("note_id", "integer", "Note id."),
          opt("title", "string", "New title."), opt("body", "string", "New text."),
          opt("tags", "array", "New tags."), returns="the updated note", mutates=True)
def update_note(world, note_id, **fields):
    show_note(world, note_id)
    changes = {k: v for k, v in fields.items() if v is not None}
    if not changes:
        raise ApiError("notes.update_note: give at least one field to change")
    return world.store.update("notes", note_id, {**changes, "updated_at": fmt_time(world.now)})


@endpoint("notes.delete_note", "Delete a note.", req("note_id", "integer", "Note id."),
          returns="{deleted: id}", mutates=True)
def delete_note(world, note_id):
    show_note(world, note_id)
    world.store.delete("notes", note_id)
    return {"deleted": note_id}


# ---- todo ----------------------------------------------------------------------------------------
def _todo(world: World, key: int) -> dict:
    return found(world.store.get("todos", key), "todo", key)


@endpoint("todo.list_todos", "Todos, soonest due first.",
          opt("list_name", "string", "Only this list (personal, work, errands, ...)."),
          opt("completed", "boolean", "Only completed (true) or open (false) todos."),
          opt("due_before", "string", "Only todos due at or before this time."),
          opt("limit", "integer", "Most results (max 20).", 10), returns="list of todos")
def list_todos(world, list_name, completed, due_before, limit):
    sql, params = "SELECT * FROM todos WHERE 1 = 1", []
    if list_name is not None:
        sql += " AND list_name = ?"
        params.append(list_name.strip().lower())
    if completed is not None:
        sql += " AND completed = ?"
        params.append(int(completed))
    if due_before is not None:
        sql += " AND due <= ?"
        params.append(as_time(due_before, "due_before", end_of_day=True))
    return world.store.rows(sql + " ORDER BY due, id LIMIT ?", (*params, limit_of(limit)))


@endpoint("todo.create_todo", "Add a todo.", req("title", "string", "What to do."),
          opt("list_name", "string", "List.", "personal"),
          opt("due", "string", "Due time, 'YYYY-MM-DD HH:MM'."),
          opt("priority", "integer", "1 (high) to 3 (low).", 2), returns="the new todo",
          mutates=True)
def create_todo(world, title, list_name, due, priority):
    if priority not in (1, 2, 3):
        raise ApiError("argument 'priority' must be 1, 2 or 3")
    key = world.store.insert("todos", {
        "title": title.strip(), "list_name": list_name.strip().lower(),
        "due": as_time(due, "due") if due else None, "priority": priority, "completed": 0,
        "completed_at": None})
    return world.store.get("todos", key)


@endpoint("todo.complete_todo", "Mark a todo done.", req("todo_id", "integer", "Todo id."),
          returns="the updated todo", mutates=True)
def complete_todo(world, todo_id):
    if _todo(world, todo_id)["completed"]:
        raise ApiError(f"todo {todo_id} is already completed")
    return world.store.update("todos", todo_id, {"completed": 1,
                                                 "completed_at": fmt_time(world.now)})


@endpoint("todo.update_todo", "Change a todo.", req("todo_id", "integer", "Todo id."),
          opt("title", "string", "New title."), opt("list_name", "string", "New list."),
          opt("due", "string", "New due time."), opt("priority", "integer", "New priority."),
          returns="the updated todo", mutates=True)
def update_todo(world, todo_id, **fields):
    _todo(world, todo_id)
    changes = {k: v for k, v in fields.items() if v is not None}
    if "due" in changes:
        changes["due"] = as_time(changes["due"], "due")
    if not changes:
        raise ApiError("todo.update_todo: give at least one field to change")
    return world.store.update("todos", todo_id, changes)


@endpoint("todo.delete_todo", "Delete a todo.", req("todo_id", "integer", "Todo id."),
          returns="{deleted: id}", mutates=True)
def delete_todo(world, todo_id):
    _todo(world, todo_id)
    world.store.delete("todos", todo_id)
    return {"deleted": todo_id}
