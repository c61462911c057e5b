"""``agentrl endpoint`` (core/serve/) and its uvicorn runner (storage/asgi_serve.py) against a
hostile client, each break measured on loopback before its fix:

* a 10,000-character ``stop`` string held the one generation worker 22 s and kept 1 GB for
  good (transformers' ``stop_strings`` builds a table over the whole vocabulary per stop string
  and caches eight); four of them ran past 60 s. The server now looks for stop strings itself.
* 64 connections each dripping a body (a byte every 2 s) got every other client 503 for the
  whole 30 s body deadline, and again after each reconnect: a body still arriving counted as
  busy. One arriving longer than ``body_grace_s`` is now closed for a new connection.
* a lone surrogate (``"\\ud800"``) in a message, a role or a stop string was a 500 from deep in
  the tokenizer; ``n: true`` and ``n: 1.0`` were taken as ``n = 1``.
* a second SIGTERM / Ctrl-C during shutdown did nothing: the server waited out every request in
  flight and queued (``request_s`` + ``body_s``, 630 s by default) with no way to stop it short
  of SIGKILL.
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse
from starlette.routing import Route

from core.serve.chat_model import ChatModel
from core.serve.chat_request import RequestError, parse_chat_request
from storage.asgi_serve import ServeLimits, read_body, serve

ROOT = Path(__file__).resolve().parent.parent


def until(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}"
        time.sleep(0.01)


def ask(addr, request: bytes, timeout: float = 10.0) -> bytes:
    with socket.create_connection(addr, timeout=timeout) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):  # up to the end of the first answer
            data += chunk
            head, whole, body = data.partition(b"\r\n\r\n")
            length = [int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                      if line.startswith(b"content-length:")]
            if whole and length and len(body) >= length[0]:
                break
        return data


# -- stop strings ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model():
    return ChatModel("tiny")


def test_a_long_stop_string_builds_no_vocabulary_table(model):
    from transformers.generation import stopping_criteria
    cached = len(stopping_criteria.STOP_STRING_EMBEDDING_CACHE)
    ids = model.prompt_ids([{"role": "user", "content": "hi"}])
    t0 = time.perf_counter()
    out = model.complete(ids, max_tokens=4, temperature=0.0, top_p=1.0, seed=0,
                         stop=["ab" * 5000], top_k=0)
    took = time.perf_counter() - t0
    assert out["usage"]["completion_tokens"] == 4 and out["finish_reason"] == "length"
    assert len(stopping_criteria.STOP_STRING_EMBEDDING_CACHE) == cached
    assert took < 5, f"{took:.1f} s for 4 tokens"  # 22 s before, under load


def test_a_stop_string_in_the_output_ends_generation_there(model):
    ids = model.prompt_ids([{"role": "user", "content": "Tell me a story"}])
    ask = dict(max_tokens=24, temperature=1.0, top_p=1.0, seed=3, top_k=0)
    text = model.complete(ids, stop=[], **ask)["text"]
    # a stop string from the middle of the seeded answer, where it first occurs
    at = next(i for i in range(len(text) // 3, len(text) - 3)
              if len(text[i:i + 3].strip()) == 3 and text.find(text[i:i + 3]) == i)
    cut = model.complete(ids, stop=[text[at:at + 3]], **ask)
    assert cut["text"] == text[:at] and cut["finish_reason"] == "stop"
    assert cut["usage"]["completion_tokens"] < 24, "generation ran on past the stop string"


# -- request fields -------------------------------------------------------------------------
@pytest.mark.parametrize("body, param", [
    (b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages[0].content"),
    (b'{"messages": [{"role": "\\udc00", "content": "a"}]}', "messages[0].role"),
    (b'{"stop": ["x", "\\udc00"], "messages": [{"role": "user", "content": "a"}]}', "stop"),
    (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "a"}]}', "model"),
    (b'{"n": true, "messages": [{"role": "user", "content": "a"}]}', "n"),
    (b'{"n": 1.0, "messages": [{"role": "user", "content": "a"}]}', "n")])
def test_lone_surrogates_and_non_integer_n_are_refused_by_name(body, param):
    got = parse_chat_request(body, context=64)
    assert isinstance(got, RequestError) and got.status == 400 and got.param == param, got


def test_a_surrogate_pair_is_text():
    got = parse_chat_request(b'{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}',
                             context=64)
    assert not isinstance(got, RequestError) and got.messages[0]["content"] == "\U0001F600"


# -- a body dripped on every connection -----------------------------------------------------
async def _echo(request):
    try:
        body = await read_body(request, cap=1000, deadline_s=30.0)
    except ClientDisconnect:  # the dripper closed for the newcomer
        return JSONResponse({}, 400)
    return JSONResponse({"bytes": len(body)})


async def _hi(request):
    return JSONResponse({"hi": 1})


APP = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/", _hi)])


def test_connections_dripping_a_body_do_not_lock_other_clients_out():
    srv = serve(APP, ServeLimits(max_connections=3, body_grace_s=0.2))
    addr = (srv.host, srv.port)
    held = [socket.create_connection(addr, timeout=10) for _ in range(3)]
    try:
        for s in held:  # headers whole, then one byte of a 100-byte body
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
        until(lambda: len(srv.server.server_state.tasks) == 3, "the three bodies to begin")
        began = [c.began for c in srv.server.server_state.connections]
        until(lambda: time.monotonic() - max(began) > 0.3, "the grace to pass")
        got = ask(addr, b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 200"), got[:120]  # 503 before
        assert srv.evicted == 1
        # the one closed was the oldest dripper; the others are still being read
        assert held[0].recv(100) == b""
    finally:
        for s in held:
            s.close()
        srv.stop()


def test_a_body_that_arrives_at_once_is_never_closed_for_a_newcomer():
    srv = serve(APP, ServeLimits(max_connections=1, body_grace_s=5.0))
    addr = (srv.host, srv.port)
    try:
        with socket.create_connection(addr, timeout=10) as s:
            s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n{")
            until(lambda: len(srv.server.server_state.tasks) == 1, "the body to begin")
            assert ask(addr, b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").startswith(b"HTTP/1.1 503")
            s.sendall(b'"a": 12}  ')
            assert s.recv(1000).startswith(b"HTTP/1.1 200")
    finally:
        srv.stop()


# -- a second signal ------------------------------------------------------------------------
def test_a_second_sigterm_stops_at_once_while_a_request_is_in_flight():
    script = textwrap.dedent("""
        import asyncio
        from starlette.applications import Starlette
        from starlette.responses import JSONResponse
        from starlette.routing import Route
        from storage.asgi_serve import ServeLimits, run

        async def slow(request):
            print("begun", flush=True)
            await asyncio.sleep(120)
            return JSONResponse({})

        app = Starlette(routes=[Route("/", slow)])
        got = run(app, ServeLimits(shutdown_s=120), on_ready=lambda s: print(s.port, flush=True))
        print("stopped by", got, flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        port = int(proc.stdout.readline())
        client = socket.create_connection(("127.0.0.1", port), timeout=30)
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        assert proc.stdout.readline().strip() == "begun"
        proc.send_signal(signal.SIGTERM)
        with pytest.raises(subprocess.TimeoutExpired):  # the first waits for the request
            proc.wait(timeout=0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, proc.stderr.read()  # 120 s before
        assert time.monotonic() - t0 < 10
        assert proc.stdout.read().strip() == f"stopped by {int(signal.SIGTERM)}"
        client.close()
    finally:
        proc.kill()
        proc.wait()


# -- answers that were not JSON -------------------------------------------------------------
@pytest.fixture(scope="module")
def endpoint(model):
    from core.serve.server import serve as serve_endpoint
    srv = serve_endpoint(model)
    yield srv.server_address[:2]
    srv.shutdown()
    srv.server_close()


@pytest.mark.parametrize("request_, status, param", [
    (b"DELETE /v1/models HTTP/1.1\r\nHost: t\r\n\r\n", b"405", None),
    (b"GET http://elsewhere/v1/models HTTP/1.1\r\nHost: t\r\n\r\n", b"404", None),
    (b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Encoding: gzip\r\n"
     b"Content-Length: 20\r\n\r\n\x1f\x8b" + b"\x00" * 18, b"415", "Content-Encoding")])
def test_every_refusal_is_an_openai_json_error(endpoint, request_, status, param):
    import json
    got = ask(endpoint, request_)
    assert got.startswith(b"HTTP/1.1 " + status), got[:200]  # was plain text, or "not UTF-8"
    error = json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    assert error["param"] == param and error["message"]


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_the_tokenizer(endpoint, model):
    import json
    # about 1.5 MiB of text: tokenized, it held the one worker seconds to learn it cannot fit
    body = json.dumps({"messages": [{"role": "user", "content": "x y " * 400_000}]}).encode()
    assert len("x y " * 400_000) > model.max_prompt_chars
    t0 = time.perf_counter()
    got = ask(endpoint, b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    took = time.perf_counter() - t0
    assert got.startswith(b"HTTP/1.1 400"), got[:200]
    error = json.loads(got.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "context_length_exceeded" and "characters" in error["message"]
    assert took < 2, f"{took:.1f} s"


def test_a_request_cut_by_a_forced_stop_gets_a_json_503(model):
    """A second signal (or the end of the grace) cancels requests in flight: they were answered
    uvicorn's plain-text 500 with a traceback logged for each."""
    import json
    import threading
    from core.serve.server import serve as serve_endpoint
    srv = serve_endpoint(model)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}],
                       "max_tokens": 4000}).encode()
    try:
        with socket.create_connection(srv.server_address[:2], timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: "
                      + str(len(body)).encode() + b"\r\n\r\n" + body)
            until(lambda: model.lock.locked(), "the generation to begin")
            stopping = threading.Thread(target=srv.shutdown)
            stopping.start()
            srv.force_stop()
            got = b""
            while chunk := s.recv(65536):  # the answer, then the close
                got += chunk
            stopping.join(30)
            assert not stopping.is_alive()
        assert got.startswith(b"HTTP/1.1 503"), got[:200]
        assert json.loads(got.partition(b"\r\n\r\n")[2])["error"]["code"] == 503
    finally:
        srv.server_close()
    until(lambda: not model.lock.locked(), "the generation to stop")
