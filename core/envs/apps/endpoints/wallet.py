"""Endpoints of the wallet app: balance, transfers, payment requests (see mail.py)."""
from __future__ import annotations

from core.envs.apps.api import (ApiError, as_cents, as_email, as_time, endpoint, found, limit_of,
                                opt, req)
from core.envs.apps.world import World, dollars, fmt_time


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
    return {**out, "direction": "sent" if mine else "received",
            "amount": dollars(row["amount_cents"])}


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
          opt("limit", "integer", "Most results (max 20).", 5), returns="list of requests")
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
