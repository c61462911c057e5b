"""The endpoints of the apps world, 40 in all: documentation, contacts and email here; calendar,
notes and todo in plans.py; wallet in wallet.py (the package imports all three).

Each is ``fn(world, **arguments)`` returning JSON-able data; writes go through the store so they
are logged as state diffs. Searches return at most ``limit`` rows (default 5-10, never more than
20) so observations stay short; reads never change state (showing a mail does not mark it read:
reading must not count as collateral damage).
"""
from __future__ import annotations

from typing import Any

from core.envs.apps.api import (ApiError, as_email, endpoint, found, like, limit_of, opt, req,
                                show_docs)
from core.envs.apps.world import World, fmt_time

endpoint("apis.show_docs", "List the apps (no arguments), an app's endpoints (app), or one "
         "endpoint's full documentation (endpoint, e.g. 'email.send_email').",
         opt("app", "string", "App name, e.g. 'calendar'."),
         opt("endpoint", "string", "Endpoint name, 'app.endpoint' or with app given just "
             "'endpoint'."),
         returns="list of apps | list of endpoints | one endpoint doc")(
    lambda world, app=None, endpoint=None: show_docs(app, endpoint))


# ---- contacts ------------------------------------------------------------------------------------
def _contact(world: World, key: int) -> dict:
    return found(world.store.get("contacts", key), "contact", key)


@endpoint("contacts.search_contacts", "Find contacts whose name or email contains query "
          "(show_contact has phone and birthday).",
          opt("query", "string", "Text in first name, last name, full name or email."),
          opt("relationship", "string", "Only this relationship, e.g. 'friend'."),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of contacts")
def search_contacts(world, query, relationship, limit):
    sql = ("SELECT * FROM contacts WHERE (lower(first_name || ' ' || last_name) LIKE ? "
           "OR lower(email) LIKE ?)")
    params: list[Any] = [like(query), like(query)]
    if relationship is not None:
        sql += " AND relationship = ?"
        params.append(relationship.strip().lower())
    rows = world.store.rows(sql + " ORDER BY id LIMIT ?", (*params, limit_of(limit)))
    keep = ("id", "first_name", "last_name", "email", "relationship")
    return [{k: r[k] for k in keep} for r in rows]


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
          req("contact_id", "integer", "Contact id."),
          opt("first_name", "string", "New first name."),
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


# ---- email ---------------------------------------------------------------------------------------
def _mail(world: World, key: int) -> dict:
    return found(world.store.get("emails", key), "email", key)


def _summary(mail: dict) -> dict:
    """A search hit: enough to pick the mail (show_email has recipients and the whole body)."""
    body = mail["body"]
    keep = ("id", "folder", "sender", "subject", "sent_at", "is_read")
    return {**{k: mail[k] for k in keep}, "preview": body[:30] + ("..." if len(body) > 30 else "")}


@endpoint("email.search_emails", "Mails by text, sender and folder, newest first; bodies are "
          "shortened (use show_email for the full text).",
          opt("query", "string", "Text in subject, body or sender."),
          opt("sender", "string", "Only mails from this address."),
          opt("folder", "string", "inbox | sent | archive (default all)."),
          opt("unread_only", "boolean", "Only unread mails.", False),
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of mail summaries")
def search_emails(world, query, sender, folder, unread_only, limit):
    sql = "SELECT * FROM emails WHERE lower(subject || ' ' || body || ' ' || sender) LIKE ?"
    params: list[Any] = [like(query)]
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
        "folder": "sent", "sender": world.me["email"],
        "recipients": [as_email(a, "to") for a in to],
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

