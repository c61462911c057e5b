"""Apps task templates about the wallet: payments, requests and history."""
from __future__ import annotations

from datetime import datetime, timedelta

from core.envs.apps.tasks import (Call, Template, is_insert, is_update_of, mail_to, money_golds,
                                  person_params, pick_contacts, template)
from core.envs.apps.world import PAY_REASONS, dollars, fmt_time


def _balance(world) -> int:
    return world.store.rows("SELECT balance_cents FROM wallet WHERE id = 1")[0]["balance_cents"]


def _clear_requests(world, email: str) -> None:
    """Drop the generated requests involving this person, so the planted one is unambiguous."""
    for row in world.store.rows("SELECT id FROM payment_requests WHERE requester = ? OR payer = ?",
                                (email, email)):
        world.store.delete("payment_requests", row["id"])


def _request(world, requester: str, payer: str, cents: int, reason: str, status: str) -> int:
    return world.store.insert("payment_requests", {
        "requester": requester, "payer": payer, "amount_cents": cents, "description": reason,
        "status": status, "created_at": fmt_time(world.now - timedelta(hours=20))})


def _is_payment_to(e: dict, email: str, cents: int | None = None) -> bool:
    return (is_insert(e, "transactions") and e["after"]["counterparty"] == email
            and (cents is None or e["after"]["amount_cents"] == -cents))


@template
class PaidTotal(Template):
    """How much did I pay X in <month>?"""
    name = "paid_total"
    kind = "answer"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        first_of_month = world.now.replace(day=1, hour=0, minute=0)
        for _ in range(rng.randrange(1, 4)):  # step back 1-3 whole months
            first_of_month = (first_of_month - timedelta(days=1)).replace(day=1)
        month_end = (first_of_month + timedelta(days=32)).replace(day=1) - timedelta(minutes=1)
        lo, hi = fmt_time(first_of_month), fmt_time(month_end)
        for row in world.store.rows("SELECT id FROM transactions WHERE counterparty = ? AND "
                                    "created_at BETWEEN ? AND ?", (c["email"], lo, hi)):
            world.store.delete("transactions", row["id"])

        def pay(cents: int, when: datetime) -> None:
            world.store.insert("transactions", {"counterparty": c["email"], "amount_cents": cents,
                                                "description": rng.choice(PAY_REASONS),
                                                "created_at": fmt_time(when)})
        sent = [rng.randrange(5_00, 80_00) for _ in range(rng.randrange(1, 4))]
        for cents in sent:
            pay(-cents, first_of_month + timedelta(days=rng.randrange(0, 28), hours=12))
        pay(rng.randrange(5_00, 50_00), first_of_month + timedelta(days=rng.randrange(0, 28)))
        # and one in the month after (never later than the world's now)
        pay(-rng.randrange(5_00, 50_00), min(month_end + timedelta(days=2),
                                             world.now - timedelta(hours=1)))
        return {**person_params(c), "month": first_of_month.strftime("%B %Y"),
                "start": lo[:10], "end": hi[:10], "total_cents": sum(sent)}

    def instruction(self, p):
        return (f"How much money did I send to {p['first']} {p['last']} in {p['month']} in "
                "total? Answer with just the amount, e.g. 12.50.")

    def golds(self, p):
        return money_golds(p["total_cents"])

    def plan(self, p):
        return [Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
                Call("wallet.search_transactions", {
                    "counterparty": p["email"], "direction": "sent", "start_date": p["start"],
                    "end_date": p["end"], "limit": 20})], f"{p['total_cents'] / 100:.2f}"


@template
class RequestDecision(Template):
    """Pay a request if it is under a limit, else decline it."""
    name = "request_decision"
    kind = "conditional"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        _clear_requests(world, c["email"])
        limit = rng.choice((40, 50, 60))
        cents = rng.randrange(10_00, limit * 100 + 1) if rng.random() < 0.5 \
            else rng.randrange(limit * 100 + 1, 150_00)
        reason = rng.choice(PAY_REASONS)
        key = _request(world, c["email"], world.me["email"], cents, reason, "pending")
        return {**person_params(c), "limit": limit, "cents": cents, "reason": reason,
                "request_id": key, "pay": cents <= limit * 100}

    def instruction(self, p):
        return (f"{p['first']} {p['last']} sent me a payment request for {p['reason']}. If it is "
                f"${p['limit']} or less, pay it; otherwise decline it.")

    def checks(self, p, final):
        row = final.row("payment_requests", p["request_id"]) or {}
        status = row.get("status")
        if not p["pay"]:
            return [("request_declined", status == "declined", f"status {status}")]
        paid = [e for e in final.diff if _is_payment_to(e, p["email"], p["cents"])]
        return [("request_paid", status == "paid", f"status {status}"),
                ("payment_sent", len(paid) == 1, f"{len(paid)} payment(s) of {p['cents']} cents")]

    def allowed(self, p, e):
        if is_update_of(e, "payment_requests", [p["request_id"]], {"status"}):
            return True
        return p["pay"] and (is_update_of(e, "wallet", [1], {"balance_cents"})
                             or _is_payment_to(e, p["email"], p["cents"]))

    def plan(self, p):
        decide = "wallet.pay_request" if p["pay"] else "wallet.decline_request"
        return [Call("wallet.list_payment_requests", {"direction": "received",
                                                      "status": "pending"}),
                Call(decide, {"request_id": p["request_id"]})], "done"


@template
class SplitBill(Template):
    name = "split_bill"

    def plant(self, world, rng):
        a, b = pick_contacts(world, rng, 2)
        share = rng.randrange(8_00, 60_00)
        return {**person_params(a, "a_"), **person_params(b, "b_"), "share_cents": share,
                "total_cents": 3 * share, "reason": rng.choice(PAY_REASONS)}

    def instruction(self, p):
        return (f"I paid ${p['total_cents'] / 100:.2f} for {p['reason']}, shared equally between "
                f"me, {p['a_first']} {p['a_last']} and {p['b_first']} {p['b_last']}. Send each "
                "of them a payment request for their share.")

    def checks(self, p, final):
        out = []
        for who in ("a_", "b_"):
            asks = [r for r in final.inserted("payment_requests") if r["payer"] == p[who + "email"]
                    and r["amount_cents"] == p["share_cents"]]
            out.append((f"request_to_{p[who + 'first'].lower()}", len(asks) == 1,
                        f"{len(asks)} request(s) of {p['share_cents']} cents"))
        return out

    def allowed(self, p, e):
        return is_insert(e, "payment_requests") and e["after"]["payer"] in (p["a_email"],
                                                                           p["b_email"])

    def plan(self, p):
        amount = dollars(p["share_cents"])
        return [Call("contacts.search_contacts", {"query": f"{p['a_first']} {p['a_last']}"}),
                Call("contacts.search_contacts", {"query": f"{p['b_first']} {p['b_last']}"}),
                Call("wallet.request_money", {"from_email": p["a_email"], "amount": amount,
                                              "description": p["reason"]}),
                Call("wallet.request_money", {"from_email": p["b_email"], "amount": amount,
                                              "description": p["reason"]})], "done"


@template
class ChaseRequest(Template):
    """If my request to X is still pending, remind X by mail; if paid, add a thank-you todo."""
    name = "chase_request"
    kind = "conditional"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        _clear_requests(world, c["email"])
        cents, reason = rng.randrange(10_00, 90_00), rng.choice(PAY_REASONS)
        pending = rng.random() < 0.5
        key = _request(world, world.me["email"], c["email"], cents, reason,
                       "pending" if pending else "paid")
        return {**person_params(c), "cents": cents, "reason": reason, "request_id": key,
                "pending": pending}

    def instruction(self, p):
        return (f"Check whether {p['first']} {p['last']} has paid my payment request for "
                f"{p['reason']}. If it is still pending, email {p['first']} a reminder that "
                f"mentions the amount; if it has been paid, add a todo 'Thank {p['first']}' to "
                "my personal list.")

    def _title(self, p) -> str:
        return f"thank {p['first']}".lower()

    def checks(self, p, final):
        if p["pending"]:
            amount = f"{p['cents'] / 100:.2f}"
            told = [m for m in final.sent() if p["email"] in m["recipients"]
                    and amount in m["subject"] + " " + m["body"]]
            return [("reminder_sent", bool(told), f"{len(told)} mail(s) mentioning {amount}")]
        todos = [t for t in final.inserted("todos") if t["title"].strip().lower() == self._title(p)
                 and t["list_name"] == "personal"]
        return [("thank_todo_created", bool(todos), f"{len(todos)} todo(s)")]

    def allowed(self, p, e):
        if p["pending"]:
            return mail_to(e, [p["email"]])
        return is_insert(e, "todos") and e["after"]["title"].strip().lower() == self._title(p)

    def plan(self, p):
        calls = [Call("wallet.list_payment_requests", {"direction": "sent"})]
        if p["pending"]:
            amount = f"{p['cents'] / 100:.2f}"
            calls.append(Call("email.send_email", {
                "to": [p["email"]], "subject": f"Reminder: {p['reason']}",
                "body": f"Hi {p['first']}, a friendly reminder about my payment request of "
                        f"${amount} for {p['reason']}. Thanks!"}))
        else:
            calls.append(Call("todo.create_todo", {"title": f"Thank {p['first']}",
                                                   "list_name": "personal"}))
        return calls, "done"


@template
class PayAndBalance(Template):
    name = "pay_and_balance"

    def plant(self, world, rng):
        c = pick_contacts(world, rng)[0]
        cents = rng.randrange(5_00, 120_00)
        return {**person_params(c), "cents": cents, "reason": rng.choice(PAY_REASONS),
                "balance_after": _balance(world) - cents}

    def instruction(self, p):
        return (f"Send {p['first']} {p['last']} ${p['cents'] / 100:.2f} for {p['reason']}, then "
                "tell me my new wallet balance (just the number).")

    def golds(self, p):
        return money_golds(p["balance_after"])

    def checks(self, p, final):
        paid = [e for e in final.diff if _is_payment_to(e, p["email"], p["cents"])]
        return [("payment_sent", len(paid) == 1, f"{len(paid)} payment(s) of {p['cents']} cents")]

    def allowed(self, p, e):
        return (is_update_of(e, "wallet", [1], {"balance_cents"})
                or _is_payment_to(e, p["email"], p["cents"]))

    def plan(self, p):
        return [Call("contacts.search_contacts", {"query": f"{p['first']} {p['last']}"}),
                Call("wallet.send_money", {"to_email": p["email"], "amount": dollars(p["cents"]),
                                           "description": p["reason"]}),
                Call("wallet.show_balance", {})], f"{p['balance_after'] / 100:.2f}"
