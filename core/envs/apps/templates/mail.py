"""Apps task templates about contacts and mail."""
from __future__ import annotations

from core.envs.apps.tasks import (Call, Final, Template, is_insert, is_update_of, mail_to,
                                  person_params, pick_contacts, stamp, template)
from core.envs.apps.world import DOMAINS, FIRST_NAMES, LAST_NAMES, RELATIONSHIPS


def _inbox(world, sender: str, subject: str, body: str, minutes_ago: int, read: bool) -> int:
    return world.store.insert("emails", {
        "folder": "inbox", "sender": sender, "recipients": [world.me["email"]],
        "subject": subject, "body": body, "sent_at": stamp(world, minutes_ago),
        "is_read": int(read), "starred": 0, "in_reply_to": None})


@template
class AddContact(Template):
    name = "add_contact"

    def plant(self, world, rng):
        taken = {p["first"] for p in world.people} | {world.me["first"]}
        first = rng.choice(sorted(set(FIRST_NAMES) - taken))
        last = rng.choice(LAST_NAMES)
        return {"first": first, "last": last,
                "email": f"{first}.{last}@{rng.choice(DOMAINS)}".lower(),
                "phone": f"555-{rng.randrange(100, 1000)}-{rng.randrange(1000, 10000)}",
                "relationship": rng.choice(RELATIONSHIPS)}

    def instruction(self, p):
        return (f"Add {p['first']} {p['last']} to my contacts: email {p['email']}, phone "
                f"{p['phone']}, relationship {p['relationship']}.")

    def checks(self, p, final: Final):
        rows = [r for r in final.inserted("contacts") if r["email"] == p["email"]]
        want = (p["first"], p["last"], p["phone"], p["relationship"])
        exact = [r for r in rows
                 if (r["first_name"], r["last_name"], r["phone"], r["relationship"]) == want]
        return [("contact_added", bool(rows), f"{len(rows)} contact(s) with {p['email']}"),
                ("contact_details_correct", bool(exact), "name, phone and relationship")]

    def allowed(self, p, e):
        return is_insert(e, "contacts") and e["after"]["email"] == p["email"]

    def plan(self, p):
        return [Call("contacts.add_contact", {
            "first_name": p["first"], "last_name": p["last"], "email": p["email"],
            "phone": p["phone"], "relationship": p["relationship"]})], "done"


@template
class UpdateContactEmail(Template):
    name = "update_contact_email"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        domain = rng.choice([d for d in DOMAINS if not c["email"].endswith(d)])
        new = f"{c['first_name']}.{c['last_name']}{rng.randrange(10, 100)}@{domain}".lower()
        _inbox(world, new, "My new email address",
               f"Hi {world.me['first']}, this is my new email address: {new}. Please update your "
               f"address book. - {c['first_name']}", rng.randrange(20, 300), False)
        return {**person_params(c), "new_email": new}

    def instruction(self, p):
        return (f"{p['first']} {p['last']} wrote to me from a new email address. Update "
                f"{p['first']}'s contact so it uses that new address.")

    def checks(self, p, final):
        row = final.row("contacts", p["contact_id"])
        got = row["email"] if row else None
        return [("contact_email_updated", got == p["new_email"], f"email is {got!r}")]

    def allowed(self, p, e):
        return is_update_of(e, "contacts", [p["contact_id"]], {"email"})

    def plan(self, p):
        return [Call("email.search_emails", {"query": "new email address"}),
                Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
                Call("contacts.update_contact", {"contact_id": p["contact_id"],
                                                 "email": p["new_email"]})], "done"


@template
class UnreadCount(Template):
    name = "unread_count"
    kind = "answer"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        for _ in range(rng.randrange(0, 4)):
            _inbox(world, c["email"], "Quick question", "Do you have a minute today?",
                   rng.randrange(30, 5000), False)
        for _ in range(rng.randrange(1, 3)):
            _inbox(world, c["email"], "Thanks!", "Thanks for yesterday.", rng.randrange(30, 5000),
                   True)
        count = len(world.store.rows("SELECT id FROM emails WHERE sender = ? AND folder = 'inbox' "
                                     "AND is_read = 0", (c["email"],)))
        return {**person_params(c), "count": count}

    def instruction(self, p):
        return (f"How many unread emails from {p['first']} {p['last']} are in my inbox? Answer "
                "with a number.")

    def golds(self, p):
        return (str(p["count"]),)

    def plan(self, p):
        return [Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
                Call("email.search_emails", {"sender": p["email"], "folder": "inbox",
                                             "unread_only": True, "limit": 20})], str(p["count"])


NOTE_SUBJECTS = ("Trip itinerary", "Wifi details for the cabin", "Recipe: lemon cake",
                 "Book list for the club", "Directions to the venue", "Packing list for camp")


@template
class SaveEmailAsNote(Template):
    name = "save_email_as_note"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        subject = rng.choice(NOTE_SUBJECTS)
        body = (f"Hi {world.me['first']}, here it is: {subject.lower()}. Step one is on page "
                f"{rng.randrange(2, 40)}, bring {rng.choice(('boots', 'snacks', 'a pen'))} and "
                f"the code is {rng.randrange(1000, 10000)}. - {c['first_name']}")
        key = _inbox(world, c["email"], subject, body, rng.randrange(60, 4000), True)
        return {**person_params(c), "subject": subject, "body": body, "email_id": key}

    def instruction(self, p):
        return (f"Find the email from {p['first']} with the subject '{p['subject']}' and save its "
                f"full text as a new note titled '{p['subject']}'.")

    def checks(self, p, final):
        notes = [n for n in final.inserted("notes")
                 if n["title"].strip().lower() == p["subject"].lower()]
        full = [n for n in notes if p["body"].strip() in n["body"]]
        return [("note_created", bool(notes), f"{len(notes)} note(s) titled {p['subject']!r}"),
                ("note_has_email_text", bool(full), "note body contains the mail's full text")]

    def allowed(self, p, e):
        return is_insert(e, "notes") and e["after"]["title"].strip().lower() == p["subject"].lower()

    def plan(self, p):
        return [Call("email.search_emails", {"query": p["subject"]}),
                Call("email.show_email", {"email_id": p["email_id"]}),
                Call("notes.create_note", {"title": p["subject"], "body": p["body"]})], "done"


REPLIES = ("Sounds good, see you Friday!", "Thanks, I will take a look tonight.",
           "Yes, count me in.", "Got it, I will send the file tomorrow.")


@template
class ReplyLatest(Template):
    name = "reply_latest"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        for _ in range(rng.randrange(1, 3)):
            _inbox(world, c["email"], "Re: schedule", "What time works for you?",
                   rng.randrange(2000, 9000), True)
        subject = rng.choice(("Plans for Friday", "The report draft", "Dinner next week?"))
        key = _inbox(world, c["email"], subject, "What do you think?", rng.randrange(10, 25),
                     rng.random() < 0.5)
        return {**person_params(c), "email_id": key, "subject": subject,
                "text": rng.choice(REPLIES)}

    def instruction(self, p):
        return (f"Reply to the most recent email from {p['first']} {p['last']} with exactly this "
                f"text: \"{p['text']}\"")

    def checks(self, p, final):
        replies = [m for m in final.sent() if p["text"] in m["body"] and (
            m["in_reply_to"] == p["email_id"]
            or (m["recipients"] == [p["email"]] and m["subject"] == "Re: " + p["subject"]))]
        return [("reply_sent", bool(replies), f"replies to mail {p['email_id']} with the text")]

    def allowed(self, p, e):
        return mail_to(e, [p["email"]])

    def plan(self, p):
        return [Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
                Call("email.search_emails", {"sender": p["email"]}),
                Call("email.reply_to_email", {"email_id": p["email_id"],
                                              "body": p["text"]})], "done"


@template
class ArchiveReadNewsletters(Template):
    name = "archive_read_newsletters"
    kind = "conditional"

    def plant(self, world, rng):
        sender = f"news@{rng.choice(('greengrocer', 'bookbarn', 'citycycle', 'techdigest'))}.test"
        read = [True, False] + [rng.random() < 0.6 for _ in range(rng.randrange(1, 4))]
        rng.shuffle(read)
        keys = [_inbox(world, sender, f"Newsletter #{i + 1}", "This week's news and offers.",
                       rng.randrange(60, 20000), r) for i, r in enumerate(read)]
        return {"sender": sender, "targets": [k for k, r in zip(keys, read) if r],
                "keep": [k for k, r in zip(keys, read) if not r]}

    def instruction(self, p):
        return (f"Archive every email in my inbox from {p['sender']} that I have already read. "
                "Leave the unread ones in the inbox.")

    def checks(self, p, final):
        out = []
        for key in p["targets"]:
            row = final.row("emails", key)
            out.append((f"email_{key}_archived", bool(row) and row["folder"] == "archive",
                        f"folder {row['folder'] if row else 'deleted'}"))
        return out

    def allowed(self, p, e):
        return is_update_of(e, "emails", p["targets"], {"folder"})

    def plan(self, p):
        calls = [Call("email.search_emails", {"sender": p["sender"], "folder": "inbox",
                                              "limit": 10})]
        return calls + [Call("email.archive_email", {"email_id": k}) for k in p["targets"]], "done"
