"""The endpoints of the apps world (contacts, calendar, email, notes, todo, wallet), 40 in all.

Each is ``fn(world, **arguments)`` returning JSON-able data; writes go through the store so they
are logged as state diffs. Searches return at most ``limit`` rows (default 5-10, never more than
20) so observations stay short; reads never change state (showing a mail does not mark it read:
reading must not count as collateral damage).
"""
from __future__ import annotations

from typing import Any

from core.envs.apps_api import (ApiError, as_cents, as_email, as_time, endpoint, found, limit_of,
                                opt, req, show_docs)
from core.envs.apps_world import World, dollars, fmt_time

endpoint("apis.show_docs", "List the apps (no arguments), an app's endpoints (app), or one "
         "endpoint's full documentation (endpoint, e.g. 'email.send_email').",
         opt("app", "string", "App name, e.g. 'calendar'."),
         opt("endpoint", "string", "Endpoint name, 'app.endpoint' or with app given just "
             "'endpoint'."),
         returns="list of apps | list of endpoints | one endpoint doc")(
    lambda world, app=None, endpoint=None: show_docs(app, endpoint))


def _like(text: str | None) -> str:
    return f"%{(text or '').strip().lower()}%"


# ---- contacts ------------------------------------------------------------------------------------
def _contact(world: World, key: int) -> dict:
    return found(world.store.get("contacts", key), "contact", key)


@endpoint("contacts.search_contacts", "Find contacts whose name or email contains query.",
          opt("query", "string", "Text in first name, last name, full name or email."),
          opt("relationship", "string", "Only this relationship, e.g. 'friend'."),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of contacts")
def search_contacts(world, query, relationship, limit):
    sql = ("SELECT * FROM contacts WHERE (lower(first_name || ' ' || last_name) LIKE ? "
           "OR lower(email) LIKE ?)")
    params: list[Any] = [_like(query), _like(query)]
    if relationship is not None:
        sql += " AND relationship = ?"
        params.append(relationship.strip().lower())
    return world.store.rows(sql + " ORDER BY id LIMIT ?", (*params, limit_of(limit)))


@endpoint("contacts.show_contact", "One contact by id.",
          req("contact_id", "integer", "Contact id."), returns="contact")
def show_contact(world, contact_id):
    return _contact(world, contact_id)


@endpoint("contacts.add_contact", "Add a contact.",
          req("first_name", "string", "First name."), req("last_name", "string", "Last name."),
          req("email", "string", "Email address."), opt("phone", "string", "Phone number."),
          opt("relationship", "string", "friend, family, coworker, ...", "friend"),
          opt("birthday", "string", "YYYY-MM-DD."), returns="the new contact", mutates=True)
def add_contact(world, first_name, last_name, email, phone, relationship, birthday):
    email = as_email(email, "email")
    if world.store.rows("SELECT id FROM contacts WHERE email = ?", (email,)):
        raise ApiError(f"a contact with email {email} already exists")
    key = world.store.insert("contacts", {
        "first_name": first_name.strip(), "last_name": last_name.strip(), "email": email,
        "phone": phone, "relationship": relationship.strip().lower(), "birthday": birthday})
    return world.store.get("contacts", key)


@endpoint("contacts.update_contact", "Change some fields of a contact.",
          req("contact_id", "integer", "Contact id."), opt("first_name", "string", "New first name."),
          opt("last_name", "string", "New last name."), opt("email", "string", "New email."),
          opt("phone", "string", "New phone."), opt("relationship", "string", "New relationship."),
          opt("birthday", "string", "New birthday, YYYY-MM-DD."),
          returns="the updated contact", mutates=True)
def update_contact(world, contact_id, **fields):
    _contact(world, contact_id)
    changes = {k: v for k, v in fields.items() if v is not None}
    if "email" in changes:
        changes["email"] = as_email(changes["email"], "email")
    if not changes:
        raise ApiError("contacts.update_contact: give at least one field to change")
    return world.store.update("contacts", contact_id, changes)


@endpoint("contacts.delete_contact", "Delete a contact.",
          req("contact_id", "integer", "Contact id."), returns="{deleted: id}", mutates=True)
def delete_contact(world, contact_id):
    _contact(world, contact_id)
    world.store.delete("contacts", contact_id)
    return {"deleted": contact_id}


@endpoint("contacts.list_relationships", "The relationship values in use.", returns="list")
def list_relationships(world):
    return [r["relationship"] for r in world.store.rows(
        "SELECT DISTINCT relationship FROM contacts ORDER BY relationship")]


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
    params: list[Any] = [_like(query)]
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


# ---- email ---------------------------------------------------------------------------------------
def _mail(world: World, key: int) -> dict:
    return found(world.store.get("emails", key), "email", key)


def _summary(mail: dict) -> dict:
    body = mail["body"]
    keep = ("id", "folder", "sender", "recipients", "subject", "sent_at", "is_read")
    return {**{k: mail[k] for k in keep}, "preview": body[:40] + ("..." if len(body) > 40 else "")}


@endpoint("email.search_emails", "Mails by text, sender and folder, newest first; bodies are "
          "shortened (use show_email for the full text).",
          opt("query", "string", "Text in subject, body or sender."),
          opt("sender", "string", "Only mails from this address."),
          opt("folder", "string", "inbox | sent | archive (default all)."),
          opt("unread_only", "boolean", "Only unread mails.", False),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of mail summaries")
def search_emails(world, query, sender, folder, unread_only, limit):
    sql = "SELECT * FROM emails WHERE lower(subject || ' ' || body || ' ' || sender) LIKE ?"
    params: list[Any] = [_like(query)]
    if sender is not None:
        sql += " AND sender = ?"
        params.append(sender.strip().lower())
    if folder is not None:
        if folder not in ("inbox", "sent", "archive"):
            raise ApiError(f"argument 'folder' must be inbox, sent or archive, got {folder!r:.20}")
        sql += " AND folder = ?"
        params.append(folder)
    if unread_only:
        sql += " AND is_read = 0"
    rows = world.store.rows(sql + " ORDER BY sent_at DESC, id DESC LIMIT ?",
                            (*params, limit_of(limit)))
    return [_summary(r) for r in rows]


@endpoint("email.show_email", "One mail in full (does not mark it read).",
          req("email_id", "integer", "Mail id."), returns="mail")
def show_email(world, email_id):
    return _mail(world, email_id)


def _send(world: World, to: list[str], subject: str, body: str, reply_to: int | None = None):
    if not to:
        raise ApiError("argument 'to' must name at least one recipient")
    key = world.store.insert("emails", {
        "folder": "sent", "sender": world.me["email"], "recipients": [as_email(a, "to") for a in to],
        "subject": subject, "body": body, "sent_at": fmt_time(world.now), "is_read": 1,
        "starred": 0, "in_reply_to": reply_to})
    return world.store.get("emails", key)


@endpoint("email.send_email", "Send a new mail.", req("to", "array", "Recipient emails."),
          req("subject", "string", "Subject."), req("body", "string", "Text."),
          returns="the sent mail", mutates=True)
def send_email(world, to, subject, body):
    return _send(world, to, subject, body)


@endpoint("email.reply_to_email", "Reply to a mail's sender (subject gets 'Re: ').",
          req("email_id", "integer", "Mail to answer."), req("body", "string", "Text."),
          returns="the sent mail", mutates=True)
def reply_to_email(world, email_id, body):
    mail = _mail(world, email_id)
    to = mail["recipients"] if mail["sender"] == world.me["email"] else [mail["sender"]]
    subject = mail["subject"] if mail["subject"].startswith("Re: ") else "Re: " + mail["subject"]
    return _send(world, to, subject, body, reply_to=email_id)


@endpoint("email.forward_email", "Forward a mail.", req("email_id", "integer", "Mail id."),
          req("to", "array", "Recipient emails."), opt("body", "string", "Text above it.", ""),
          returns="the sent mail", mutates=True)
def forward_email(world, email_id, to, body):
    mail = _mail(world, email_id)
    text = f"{body}\n---------- Forwarded ----------\nFrom: {mail['sender']}\n{mail['body']}"
    return _send(world, to, "Fwd: " + mail["subject"], text.strip())


def _flag(world: World, email_id: int, **values) -> dict:
    _mail(world, email_id)
    return _summary(world.store.update("emails", email_id, values))


@endpoint("email.mark_read", "Mark a mail read (or unread with read=false).",
          req("email_id", "integer", "Mail id."), opt("read", "boolean", "Read state.", True),
          returns="mail summary", mutates=True)
def mark_read(world, email_id, read):
    return _flag(world, email_id, is_read=int(read))


@endpoint("email.star_email", "Star a mail (or unstar with starred=false).",
          req("email_id", "integer", "Mail id."), opt("starred", "boolean", "Star state.", True),
          returns="mail summary", mutates=True)
def star_email(world, email_id, starred):
    return _flag(world, email_id, starred=int(starred))


@endpoint("email.archive_email", "Move a mail to the archive folder.",
          req("email_id", "integer", "Mail id."), returns="mail summary", mutates=True)
def archive_email(world, email_id):
    return _flag(world, email_id, folder="archive")


@endpoint("email.delete_email", "Delete a mail for good.", req("email_id", "integer", "Mail id."),
          returns="{deleted: id}", mutates=True)
def delete_email(world, email_id):
    _mail(world, email_id)
    world.store.delete("emails", email_id)
    return {"deleted": email_id}


# ---- notes ---------------------------------------------------------------------------------------
@endpoint("notes.search_notes", "Notes by text and tag, newest first.",
          opt("query", "string", "Text in title or body."), opt("tag", "string", "Only this tag."),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of notes")
def search_notes(world, query, tag, limit):
    sql = "SELECT * FROM notes WHERE lower(title || ' ' || body) LIKE ?"
    params: list[Any] = [_like(query)]
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


# ---- wallet --------------------------------------------------------------------------------------
def _balance(world: World) -> int:
    return world.store.rows("SELECT balance_cents FROM wallet WHERE id = 1")[0]["balance_cents"]


def _txn(row: dict) -> dict:
    out = {k: row[k] for k in ("id", "counterparty", "description", "created_at")}
    return {**out, "direction": "received" if row["amount_cents"] > 0 else "sent",
            "amount": dollars(abs(row["amount_cents"]))}


def _request(world: World, row: dict) -> dict:
    out = {k: row[k] for k in ("id", "requester", "payer", "description", "status", "created_at")}
    mine = row["requester"] == world.me["email"]
    return {**out, "direction": "sent" if mine else "received", "amount": dollars(row["amount_cents"])}


def _transfer(world: World, email: str, cents: int, description: str) -> dict:
    balance = _balance(world)
    if cents > balance:
        raise ApiError(f"insufficient balance: {dollars(balance):.2f} < {dollars(cents):.2f}")
    world.store.update("wallet", 1, {"balance_cents": balance - cents})
    key = world.store.insert("transactions", {"counterparty": email, "amount_cents": -cents,
                                              "description": description,
                                              "created_at": fmt_time(world.now)})
    return _txn(world.store.get("transactions", key))


@endpoint("wallet.show_balance", "The wallet balance.", returns="{balance}")
def show_balance(world):
    return {"balance": dollars(_balance(world))}


@endpoint("wallet.search_transactions", "Transactions, newest first.",
          opt("counterparty", "string", "Only with this email."),
          opt("direction", "string", "sent | received."),
          opt("start_date", "string", "From this date (YYYY-MM-DD), inclusive."),
          opt("end_date", "string", "Up to this date (YYYY-MM-DD), inclusive."),
          opt("limit", "integer", "Most results (max 20).", 10), returns="list of transactions")
def search_transactions(world, counterparty, direction, start_date, end_date, limit):
    sql, params = "SELECT * FROM transactions WHERE 1 = 1", []
    if counterparty is not None:
        sql += " AND counterparty = ?"
        params.append(counterparty.strip().lower())
    if direction is not None:
        if direction not in ("sent", "received"):
            raise ApiError(f"argument 'direction' must be sent or received, got {direction!r:.20}")
        sql += " AND amount_cents < 0" if direction == "sent" else " AND amount_cents > 0"
    if start_date is not None:
        sql += " AND created_at >= ?"
        params.append(as_time(start_date, "start_date"))
    if end_date is not None:
        sql += " AND created_at <= ?"
        params.append(as_time(end_date, "end_date", end_of_day=True))
    rows = world.store.rows(sql + " ORDER BY created_at DESC, id DESC LIMIT ?",
                            (*params, limit_of(limit)))
    return [_txn(r) for r in rows]


@endpoint("wallet.send_money", "Pay someone from the wallet.",
          req("to_email", "string", "Recipient email."), req("amount", "number", "Dollars."),
          req("description", "string", "What it is for."), returns="the transaction",
          mutates=True)
def send_money(world, to_email, amount, description):
    return _transfer(world, as_email(to_email, "to_email"), as_cents(amount), description)


@endpoint("wallet.request_money", "Ask someone to pay you.",
          req("from_email", "string", "Who should pay."), req("amount", "number", "Dollars."),
          req("description", "string", "What it is for."), returns="the request", mutates=True)
def request_money(world, from_email, amount, description):
    key = world.store.insert("payment_requests", {
        "requester": world.me["email"], "payer": as_email(from_email, "from_email"),
        "amount_cents": as_cents(amount), "description": description, "status": "pending",
        "created_at": fmt_time(world.now)})
    return _request(world, world.store.get("payment_requests", key))


@endpoint("wallet.list_payment_requests", "Payment requests, newest first.",
          opt("direction", "string", "sent (you asked) | received (asked of you)."),
          opt("status", "string", "pending | paid | declined."),
          opt("limit", "integer", "Most results (max 20).", 10), returns="list of requests")
def list_payment_requests(world, direction, status, limit):
    sql, params = "SELECT * FROM payment_requests WHERE 1 = 1", []
    if direction is not None:
        if direction not in ("sent", "received"):
            raise ApiError(f"argument 'direction' must be sent or received, got {direction!r:.20}")
        sql += " AND requester = ?" if direction == "sent" else " AND payer = ?"
        params.append(world.me["email"])
    if status is not None:
        sql += " AND status = ?"
        params.append(status)
    rows = world.store.rows(sql + " ORDER BY created_at DESC, id DESC LIMIT ?",
                            (*params, limit_of(limit)))
    return [_request(world, r) for r in rows]


def _pending_to_me(world: World, request_id: int) -> dict:
    row = found(world.store.get("payment_requests", request_id), "payment request", request_id)
    if row["payer"] != world.me["email"]:
        raise ApiError(f"payment request {request_id} was not sent to you")
    if row["status"] != "pending":
        raise ApiError(f"payment request {request_id} is already {row['status']}")
    return row


@endpoint("wallet.pay_request", "Pay a payment request sent to you.",
          req("request_id", "integer", "Request id."), returns="the transaction", mutates=True)
def pay_request(world, request_id):
    row = _pending_to_me(world, request_id)
    txn = _transfer(world, row["requester"], row["amount_cents"], row["description"])
    world.store.update("payment_requests", request_id, {"status": "paid"})
    return txn


@endpoint("wallet.decline_request", "Decline a payment request sent to you.",
          req("request_id", "integer", "Request id."), returns="the request", mutates=True)
def decline_request(world, request_id):
    _pending_to_me(world, request_id)
    world.store.update("payment_requests", request_id, {"status": "declined"})
    return _request(world, world.store.get("payment_requests", request_id))

