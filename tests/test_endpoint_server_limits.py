"""core/serve/server.py against clients that misbehave: the key checked before the body, a
bounded body, bad fields and lengths answered with a JSON error naming them, ``max_tokens``
bounded by the model's context, generation stopped when the client leaves or the deadline
passes, a bounded number of connections and a bounded record of what was seen.

The request checks are tested as the pure functions they are (core/serve/chat_request.py); everything
else against the real server (threads in this process, the tiny model) over raw sockets, since
the malformed requests are what no HTTP library would send.
"""
from __future__ import annotations

import json
import socket
import time

import pytest

from core.serve.chat_request import (ChatRequest, RequestError, completion_budget, content_length,
                               parse_chat_request)
from core.serve.client_watch import ClientWatch, client_gone
from core.commands.endpoint import main
from core.serve.server import ChatModel, Limits, serve
from core.serve.fault_plan import SEEN_BYTES, SEEN_MAX, FaultPlan

KEY = "sk-limits-7Hq2"
HI = [{"role": "user", "content": "hi"}]


# -- pure pieces --------------------------------------------------------------------------------
@pytest.mark.parametrize("values, te, status", [
    ([], None, 411), (["-1"], None, 400), (["abc"], None, 400), (["1e3"], None, 400),
    (["12", "13"], None, 400), (["9" * 30], None, 400), (["2000"], None, 413),
    (["10"], "chunked", 411)])
def test_content_length_refusals_name_the_header(values, te, status):
    err = content_length(values, te, cap=1000)
    assert isinstance(err, RequestError) and err.status == status
    assert err.param == ("Transfer-Encoding" if te else "Content-Length")
    assert content_length([" 1000 "], None, cap=1000) == 1000
    assert content_length(["12", "12"], None, cap=1000) == 12


def test_a_good_request_parses_into_its_fields():
    raw = json.dumps({"model": "m", "messages": [{"role": "system", "content": None},
                                                  {"role": "user", "content": [
                                                      {"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}],
                      "max_tokens": 7, "max_completion_tokens": 5, "temperature": 0,
                      "top_p": 0.5, "seed": -3, "stop": "x", "logprobs": True,
                      "top_logprobs": 2, "n": 1, "stream": False}).encode()
    assert parse_chat_request(raw, context=100) == ChatRequest(
        messages=[{"role": "system", "content": ""}, {"role": "user", "content": "ab"}],
        max_tokens=5, temperature=0, top_p=0.5, seed=-3, stop=("x",), logprobs=True,
        top_logprobs=2, model="m")


@pytest.mark.parametrize("body, param", [
    (b"\xff\xfe{}", "body"), (b"{nope", "body"), (b"[1, 2]", "body"), (b"[" * 100_000, "body"),
    (b"{}", "messages"), ({"messages": "hi"}, "messages"), ({"messages": []}, "messages"),
    ({"messages": ["hi"]}, "messages[0]"), ({"messages": HI * 4097}, "messages"),
    ({"messages": HI + [{"role": 3, "content": "x"}]}, "messages[1].role"),
    ({"messages": HI + [{"role": "user", "content": 5}]}, "messages[1].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"max_tokens": "10"}, "max_tokens"), ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_tokens": 10 ** 6}, "max_tokens"),
    ({"max_tokens": 2.5}, "max_tokens"), ({"max_completion_tokens": -1}, "max_completion_tokens"),
    ({"temperature": "hot"}, "temperature"), ({"temperature": 3}, "temperature"),
    ({"top_p": 1.5}, "top_p"), ({"top_p": [1]}, "top_p"), ({"seed": 1.5}, "seed"),
    ({"seed": "7"}, "seed"), ({"stop": 5}, "stop"), ({"stop": ["a", 1]}, "stop"),
    ({"stop": list("abcde")}, "stop"), ({"logprobs": "yes"}, "logprobs"),
    ({"top_logprobs": 21}, "top_logprobs"), ({"n": 2}, "n"), ({"stream": "yes"}, "stream"),
    ({"model": 5}, "model")])
def test_each_bad_field_is_refused_by_name(body, param):
    raw = body if isinstance(body, bytes) else json.dumps({"messages": HI, **body}).encode()
    err = parse_chat_request(raw, context=4096)
    assert isinstance(err, RequestError) and err.status == 400 and err.param == param
    assert err.body()["error"]["param"] == param
    assert err.body()["error"]["message"].startswith(f"{param}: ")


def test_max_tokens_must_fit_the_room_the_prompt_leaves():
    assert completion_budget(None, 10, 4096) == 256          # the default...
    assert completion_budget(None, 4000, 4096) == 96         # ...at most the room left
    assert completion_budget(96, 4000, 4096) == 96
    err = completion_budget(97, 4000, 4096)
    assert err.param == "max_tokens" and "4096 - 4000 prompt tokens = 96" in err.message
    assert completion_budget(None, 4096, 4096).param == "messages"


def test_what_the_server_keeps_is_bounded():
    plan = FaultPlan()
    for i in range(SEEN_MAX + 5):
        plan.record({"seed": i, "messages": HI, "bytes": 10})
    assert len(plan.seen) == SEEN_MAX and plan.seen[0]["seed"] == 5
    plan.seen = []                                             # as tests reset it
    for i in range(3):
        plan.record({"seed": i, "messages": HI, "bytes": SEEN_BYTES // 2})
    assert [e["seed"] for e in plan.seen] == [1, 2]
    plan.record({"seed": 9, "messages": HI, "bytes": SEEN_BYTES + 1})
    assert [(e["seed"], e["messages"]) for e in plan.seen] == [(9, None)]


def test_a_closed_peer_reads_as_gone_and_a_waiting_one_does_not():
    a, b = socket.socketpair()
    assert not client_gone(b)
    a.sendall(b"GET / HTTP/1.1\r\n")                          # a pipelined request is not leaving
    assert not client_gone(b)
    a.close()
    assert not client_gone(b)                                  # its unread bytes come first
    b.recv(100)
    assert client_gone(b)
    b.close()
    assert ClientWatch(None, deadline_s=0).stop()


@pytest.mark.parametrize("flag", ["--max-body-mb=0", "--max-request-s=nan",
                                  "--max-connections=1.5", "--max-connections=100000"])
def test_limit_flags_are_bounded(flag, capsys):
    with pytest.raises(SystemExit) as exc:
        main([flag])
    assert exc.value.code == 2 and flag.split("=")[0] in capsys.readouterr().err


# -- the real server ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return ChatModel("tiny")


@pytest.fixture(scope="module")
def server(model):
    srv = serve(model, api_key=KEY, limits=Limits(max_body_bytes=1 << 20))
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture(scope="module")
def tight(model):
    """A server with short deadlines and room for two connections."""
    srv = serve(model, limits=Limits(request_s=1.5, body_s=1.0, max_connections=2))
    yield srv
    srv.shutdown()
    srv.server_close()


def post(body: bytes | dict, key: str | None = KEY, length: str | None = None,
         extra: str = "") -> bytes:
    raw = json.dumps(body).encode() if isinstance(body, dict) else body
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n" + extra
    if key:
        head += f"Authorization: Bearer {key}\r\n"
    if length != "none":
        head += f"Content-Length: {len(raw) if length is None else length}\r\n"
    return (head + "\r\n").encode() + raw


def reply(sock: socket.socket) -> tuple[int, dict, dict]:
    """The next HTTP reply on ``sock``: status, headers (lower-case), JSON body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed without a reply: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:])}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the connection closed mid-reply"
        body += chunk
    return int(lines[0].split()[1]), headers, json.loads(body)


def until(condition, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.05)


def exchange(srv, request: bytes, timeout: float = 20.0) -> tuple[int, dict, dict]:
    with socket.create_connection(("127.0.0.1", srv.server_address[1]), timeout=timeout) as s:
        s.sendall(request)
        return reply(s)


def test_the_key_is_checked_before_the_body_is_read(server):
    server.faults.seen = []
    # 50 MB announced, none sent: the refusal comes at once, from the headers alone
    t0 = time.perf_counter()
    status, headers, body = exchange(server, post(b"", key="wrong", length=str(50 << 20)),
                                     timeout=10)
    assert status == 401 and headers["connection"] == "close" and time.perf_counter() - t0 < 5
    assert body["error"]["message"] == "invalid API key"
    assert server.faults.seen == [{"fault": None, "authorized": False, "seed": None,
                                   "messages": None, "bytes": 0}]


def test_a_client_that_asks_first_hears_the_refusal_instead_of_continue(server):
    status, _, body = exchange(server, post(b"", key="wrong", length=str(50 << 20),
                                            extra="Expect: 100-continue\r\n"), timeout=10)
    assert status == 401 and body["error"]["message"] == "invalid API key"
    status, _, body = exchange(server, post(b"", length=str(50 << 20),
                                            extra="Expect: 100-continue\r\n"), timeout=10)
    assert status == 413 and body["error"]["param"] == "Content-Length"


@pytest.mark.parametrize("length, extra, status", [
    ("-1", "", 400), ("abc", "", 400), ("none", "", 411), (str(2 << 20), "", 413),
    ("none", "Transfer-Encoding: chunked\r\n", 411)])
def test_bad_lengths_get_a_json_answer_without_the_body_read(server, length, extra, status):
    got, headers, body = exchange(server, post(b"", length=length, extra=extra), timeout=10)
    assert got == status and headers["connection"] == "close"
    assert body["error"]["param"] in ("Content-Length", "Transfer-Encoding")


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": "many"}, "max_tokens"), ({"temperature": []}, "temperature"),
    ({"messages": "hi"}, "messages"), ({"messages": [{"role": "user", "content": 5}]},
                                       "messages[0].content"),
    ({"max_tokens": 10 ** 6}, "max_tokens")])
def test_bad_fields_get_a_json_400_naming_them(server, fields, param):
    status, _, body = exchange(server, post({"messages": HI, **fields}))
    assert status == 400 and body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error"


def test_max_tokens_is_bounded_by_the_room_the_prompt_leaves(server, model):
    words = 3900
    messages = [{"role": "user", "content": "a " * words}]
    room = model.context - len(model.prompt_ids(messages))
    assert 0 < room < 200, "the prompt should nearly fill the context"
    status, _, body = exchange(server, post({"messages": messages, "max_tokens": room + 1}))
    assert status == 400 and body["error"]["param"] == "max_tokens"
    assert f"= {room}" in body["error"]["message"]
    status, _, body = exchange(server, post({"messages": messages, "max_tokens": min(room, 3),
                                             "temperature": 0}))
    assert status == 200 and body["usage"]["prompt_tokens"] + 3 <= model.context


def test_a_client_that_leaves_frees_the_generation_lock(server, model):
    """A 3,000-token greedy request whose client closes after 1 s: generation stops within a
    fraction of a second, and the next request is answered at once instead of after it."""
    port = server.server_address[1]
    first = socket.create_connection(("127.0.0.1", port))
    first.sendall(post({"messages": HI, "max_tokens": 3000, "temperature": 0}))
    until(model.lock.locked, "the long request to start generating")
    time.sleep(1.0)
    first.close()
    t0 = time.perf_counter()
    status, _, body = exchange(server, post({"messages": HI, "max_tokens": 2}))
    waited = time.perf_counter() - t0
    assert status == 200 and body["usage"]["completion_tokens"] <= 2
    until(lambda: server.faults.stopped, "the cut-short request to be recorded")
    cut = server.faults.stopped[-1]
    assert cut["reason"] == "client_gone" and cut["max_tokens"] == 3000
    assert cut["completion_tokens"] < 3000
    assert waited < 10, f"the next request waited {waited:.1f} s"


def test_a_request_past_its_deadline_gets_503_and_stops(tight):
    t0 = time.perf_counter()
    status, headers, body = exchange(tight, post({"messages": HI, "max_tokens": 3000,
                                                  "temperature": 0}, key=None))
    assert status == 503 and "--max-request-s" in body["error"]["message"]
    assert time.perf_counter() - t0 < 8 and headers["retry-after"] == "1"
    assert tight.faults.stopped[-1]["reason"] == "deadline"


def test_a_body_that_does_not_arrive_in_time_gets_408(tight):
    with socket.create_connection(("127.0.0.1", tight.server_address[1]), timeout=10) as s:
        s.sendall(post(b'{"messages": ', key=None, length="100"))   # 13 of 100 bytes, then none
        status, _, body = reply(s)
    assert status == 408 and "100 bytes" in body["error"]["message"]


def test_connections_beyond_the_limit_get_503_when_none_is_idle(model):
    """At the connection limit with every connection busy (a body on its way), the next one is
    answered 503 at once; an idle connection would have been closed for it instead
    (tests/test_endpoint_server_flood.py)."""
    srv = serve(model, limits=Limits(max_connections=2, body_s=30.0))
    addr = ("127.0.0.1", srv.server_address[1])
    try:
        held = [socket.create_connection(addr, timeout=10) for _ in range(2)]
        for s in held:  # 13 of 100 bytes: busy receiving a body, not idle
            s.sendall(post(b'{"messages": ', key=None, length="100"))
        until(lambda: srv.active == 2 and srv.faults.in_flight == 2, "both requests to start")
        with socket.create_connection(addr, timeout=10) as third:
            status, headers, body = reply(third)
        assert status == 503 and headers["retry-after"] == "1"
        assert "too many connections" in body["error"]["message"]
        for s in held:
            s.close()
        until(lambda: srv.active == 0, "the closed connections to free their slots")
        request = b"GET /v1/models HTTP/1.1\r\nHost: t\r\n\r\n"
        assert exchange(srv, request, timeout=10)[0] == 200
    finally:
        srv.shutdown()
        srv.server_close()
