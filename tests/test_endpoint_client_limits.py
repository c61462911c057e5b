"""The endpoint client against servers that misbehave (tests/hostile_endpoint.py: real sockets,
real HTTP): a whole-request deadline, a size cap from max_tokens, no key sent to another origin,
every reply field checked, an over-long completion cut to its budget; through a whole collection
each fault is its turn's endpoint error and the run goes on.
"""
from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import time
import tracemalloc

import duckdb
import pytest

from core.run.collection import collect
from core.config import TrainConfig
from core.endpoint.client import ChatClient, EndpointError, EndpointRefused
from core.endpoint.reply import char_budget
from storage.recorder import Recorder
from tests.hostile_endpoint import (HostileServer, completion, drip_body, drip_head,
                                    endless_chunks, send_json, slow_tls_server)

KEY = "sk-limits-5d1e0a77c4"
MESSAGES = [{"role": "user", "content": "Pull an arm."}]
ASK = dict(stop=["</answer>"], max_tokens=16, temperature=1.0, top_p=1.0, seed=3)


@pytest.fixture
def hostile():
    made = []

    def make(answer):
        made.append(HostileServer(answer))
        return made[-1]
    yield make
    for server in made:
        server.close()


def client(url: str, **kw) -> ChatClient:
    return ChatClient(url, "m", KEY, **{"timeout": 1.5, "retries": 0, "backoff": 0.01, **kw})


def failure(url: str, **kw) -> tuple[EndpointError, float]:
    t0 = time.perf_counter()
    with pytest.raises(EndpointError) as err:
        client(url, **kw).complete(MESSAGES, **ASK)
    return err.value, time.perf_counter() - t0


# -- a deadline for the whole request -----------------------------------------------------------
@pytest.mark.parametrize("drip", [drip_body, drip_head], ids=["body", "headers"])
def test_a_dripping_server_is_cut_at_the_deadline(hostile, drip):
    """One byte every 0.2 s never lets a 1.5 s read time out; the deadline ends it (twice: a
    timeout is retried once here). The server would drip for 30 s."""
    exc, took = failure(hostile(drip).url, retries=1)
    assert exc.kind == "timeout" and exc.attempts == 2, exc
    assert "took over 1.5 s" in exc.detail
    assert 3.0 <= took < 6.0


def test_a_stalled_tls_handshake_is_cut_at_the_deadline():
    listener, port = slow_tls_server()
    try:
        exc, took = failure(f"https://127.0.0.1:{port}/v1")
    finally:
        listener.close()
    assert exc.kind == "timeout" and "TLS handshake" in exc.detail, exc
    assert took < 4.0


@pytest.fixture
def tls_server(hostile, tmp_path):
    """A HostileServer over TLS with a certificate for 127.0.0.1 made now (openssl)."""
    if not shutil.which("openssl"):
        pytest.skip("openssl is not installed: no certificate to serve TLS with")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-days", "2",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    server = hostile(lambda h, b: send_json(h, completion("over TLS") if b else {"data": []}))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    return server, cert


def test_https_is_verified_and_answers_within_the_deadline(tls_server, monkeypatch):
    """The TLS path (its own handshake, for the deadline) still verifies the certificate and the
    host name: untrusted, or trusted for another name, it fails; trusted, it answers."""
    server, cert = tls_server
    url = f"https://127.0.0.1:{server.port}/v1"
    exc, _ = failure(url)
    assert exc.kind == "connection" and "CERTIFICATE_VERIFY_FAILED" in exc.detail, exc
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # read by each new default context
    exc, _ = failure(f"https://localhost:{server.port}/v1")
    assert exc.kind == "connection" and "mismatch" in exc.detail, exc
    client(url).check()
    assert client(url).complete(MESSAGES, **ASK).text == "over TLS"
    assert [s[2] for s in server.seen] == [f"Bearer {KEY}"] * 2


# -- a size cap from max_tokens -----------------------------------------------------------------
def test_an_endless_chunked_reply_is_refused_at_the_cap(hostile):
    """64 MiB of chunks for a 16-token request: refused after ~1 MiB, not retried (the server
    ignores max_tokens; it would again), memory bounded by the cap."""
    url = hostile(endless_chunks).url
    tracemalloc.start()
    try:
        exc, took = failure(url, retries=2)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert exc.kind == "too_large" and exc.attempts == 1, exc
    assert "read)" in exc.detail
    assert peak < 6 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_an_announced_oversized_body_is_not_read(hostile):
    def huge(handler, _body):
        handler.send_response(200)
        handler.send_header("Content-Length", str(10 ** 12))
        handler.end_headers()
        handler.wfile.write(b"{")
    exc, took = failure(hostile(huge).url)
    assert exc.kind == "too_large" and "1,000,000,000,000 announced" in exc.detail, exc
    assert took < 1.0


def test_a_completion_past_max_tokens_is_cut_to_the_budget(hostile):
    """A server that ignores max_tokens=16: 5,000 characters are cut to the character budget,
    40 logprob entries to 16 (and the text to what those 16 spell); both read as 'length'."""
    long_text = hostile(lambda h, b: send_json(h, completion("b" * 5000))).url
    reply = client(long_text).complete(MESSAGES, **ASK)
    assert len(reply.text) == char_budget(16) == 1280 and reply.cut_chars == 5000 - 1280
    assert reply.finish_reason == "length"
    entries = [{"token": "ab", "logprob": -0.5}] * 40
    many = hostile(lambda h, b: send_json(h, completion("ab" * 40, logprobs=entries))).url
    reply = client(many).complete(MESSAGES, **ASK)
    assert len(reply.tokens) == 16 and reply.cut_tokens == 24 and reply.text == "ab" * 16
    assert reply.finish_reason == "length" and reply.cut_chars == 48


# -- the key stays with its origin --------------------------------------------------------------
def test_a_redirect_to_another_origin_never_carries_the_key(hostile, tmp_path, monkeypatch,
                                                            capsys):
    other = hostile(lambda h, b: send_json(h, completion("elsewhere") if b else {"data": []}))

    def bounce(handler, _body):
        handler.send_response(302)
        handler.send_header("Location", other.url + handler.path[len("/v1"):])
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    first = hostile(bounce)
    with pytest.raises(EndpointRefused) as err:
        client(first.url).check()
    assert err.value.kind == "redirect" and err.value.status == 302
    assert f"from http://127.0.0.1:{first.port} to http://127.0.0.1:{other.port}" in str(err.value)
    with pytest.raises(EndpointRefused, match="redirect from"):
        client(first.url).complete(MESSAGES, **ASK)
    # through the command line: said before any run is recorded
    from core.commands.train import main
    monkeypatch.setenv("AGENTRL_OPENAI_API_KEY", KEY)
    db = tmp_path / "redirect.duckdb"
    assert main(["--env", "bandit", "--model", f"openai:{first.url}", "--model-name", "m",
                 "--steps", "1", "--group-size", "2", "--tasks-per-step", "1", "--eval-every",
                 "0", "--db", str(db), "--quiet"]) == 1
    said = capsys.readouterr().err
    assert "redirect from" in said and KEY not in said
    assert [s for s in first.seen if s[2] != f"Bearer {KEY}"] == []
    assert other.seen == []                                        # never contacted at all


def test_a_redirect_within_the_origin_is_followed(hostile):
    def moved(handler, _body):
        if handler.path == "/v1/models":
            handler.send_response(302)
            handler.send_header("Location", "/v2/models")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
        else:
            send_json(handler, {"data": []})
    server = hostile(moved)
    client(server.url).check()
    assert server.seen == [("GET", "/v1/models", f"Bearer {KEY}"),
                           ("GET", "/v2/models", f"Bearer {KEY}")]


# -- every field checked ------------------------------------------------------------------------
LP = "choices[0].logprobs.content[0]"


@pytest.mark.parametrize("body, where", [
    (completion("a", logprobs=[{"token": "a", "logprob": 1e308}]), LP + ".logprob"),
    (completion("a", logprobs=[{"token": "a", "logprob": 0.5}]), LP + ".logprob"),
    (b'{"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "logprobs": '
     b'{"content": [{"token": "a", "logprob": -Infinity}]}}]}', LP + ".logprob"),
    (b'{"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "logprobs": '
     b'{"content": [{"token": "a", "logprob": NaN}]}}]}', LP + ".logprob"),
    (b'{"choices": [{"message": {"content": "a"}, "finish_reason": "stop", "logprobs": '
     b'{"content": [{"token": "a", "logprob": -1e999}]}}]}', LP + ".logprob"),
    (completion("a", logprobs=[{"token": "a", "logprob": -1.0, "top_logprobs": [
        {"token": "b", "logprob": 3}]}]), LP + ".top_logprobs[0].logprob"),
    (completion("a", logprobs=[{"token": "a", "logprob": -1.0, "bytes": [300]}]),
     LP + ".bytes"),
    (completion("a", logprobs=[{"token": 7, "logprob": -1.0}]), LP + ".token"),
    (completion("a", usage={"completion_tokens": 1e30}), "usage.completion_tokens"),
    (completion("a", usage={"prompt_tokens": -5}), "usage.prompt_tokens"),
    (completion("a", usage={"total_tokens": "12"}), "usage.total_tokens"),
    (completion(None, finish={"reason": "stop"}), "choices[0].finish_reason"),
    (completion("a", finish="banana"), "choices[0].finish_reason"),
    (completion("a", finish=None), "choices[0].finish_reason"),
    (completion(5), "choices[0].message.content"),
    (b'{"choices": [{"message": {"content": "a\\ud800"}, "finish_reason": "stop"}]}',
     "choices[0].message.content"),
    ({"choices": []}, "choices"),
    ([1, 2], "body"),
    (b"[" * 200_000 + b"]" * 200_000, "not JSON"),
])
def test_garbage_is_a_malformed_reply_naming_the_field(hostile, body, where):
    exc, _ = failure(hostile(lambda h, b: send_json(h, body)).url, top_logprobs=2)
    assert exc.kind == "malformed" and exc.detail.startswith(where), exc.detail


def test_what_servers_really_send_is_accepted(hostile):
    """A log-probability a rounding above 0 reads as 0; TGI's eos_token is a stop; a count sent
    as 12.0 is 12; usage details (objects) are left out; alternatives past those asked for too."""
    entries = [{"token": "a", "logprob": 3e-7, "top_logprobs": [
        {"token": "a", "logprob": -0.0}, {"token": "b", "logprob": -9999.0},
        {"token": "c", "logprob": -20.0}]}]
    body = completion("a", finish="eos_token", logprobs=entries, usage={
        "prompt_tokens": 12.0, "completion_tokens": 1, "total_tokens": 13,
        "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": None})
    reply = client(hostile(lambda h, b: send_json(h, body)).url, top_logprobs=2).complete(
        MESSAGES, **ASK)
    assert reply.tokens == [("a", 0.0)] and reply.finish_reason == "stop"
    assert reply.top == [[("a", 0.0), ("b", -9999.0)]]
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 1, "total_tokens": 13}
    assert type(reply.usage["prompt_tokens"]) is int and reply.cut_chars == reply.cut_tokens == 0


# -- through a collection: the turn's error, and the run goes on ---------------------------------
def test_each_fault_is_its_turns_endpoint_error_and_the_run_goes_on(hostile, tmp_path):
    """Three trajectories, three answers in the order the requests arrive: a 2,000,019-character
    reply (over the cap), a 5,000-character one (cut, action_truncated), inf logprobs."""
    lock, arrived = threading.Lock(), []
    answers = [completion("c" * 2_000_019), completion("d" * 5000),
               completion("e", logprobs=[{"token": "e", "logprob": float("inf")}])]

    def answer(handler, body):
        if body is None:
            return send_json(handler, {"data": []})
        with lock:
            arrived.append(body["seed"])
            n = len(arrived) - 1
        send_json(handler, answers[n] if n < 3 else completion("<answer>A</answer>"))
    server = hostile(answer)
    db = tmp_path / "faults.duckdb"
    cfg = TrainConfig(env="bandit", model=f"openai:{server.url}", model_name="m", steps=1,
                      group_size=3, tasks_per_step=1, max_turns=1, max_new_tokens=16,
                      eval_every=0, db=str(db), endpoint_retries=0, endpoint_timeout=10.0)
    recorder = Recorder(str(db))
    run_id = collect(cfg, recorder, progress=False)
    recorder.close()
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone() == \
        ("finished",)
    trajs = [(f, json.loads(i)) for f, i in con.execute(
        "SELECT finish_reason, info FROM trajectories").fetchall()]
    errors = sorted(i["endpoint_error"]["kind"] for f, i in trajs if f == "endpoint_error")
    assert errors == ["malformed", "too_large"]
    malformed = [i["endpoint_error"] for _, i in trajs
                 if i.get("endpoint_error", {}).get("kind") == "malformed"][0]
    assert malformed["detail"].startswith("choices[0].logprobs.content[0].logprob: inf")
    turns = con.execute("SELECT action, action_truncated, info FROM turns").fetchall()
    assert len(turns) == 1 and turns[0][0] == "d" * 1280 and turns[0][1] is True
    endpoint = json.loads(turns[0][2])["endpoint"]
    assert endpoint["finish_reason"] == "length"
    assert (endpoint["cut_chars"], endpoint["cut_tokens"]) == (5000 - 1280, 0)  # what was cut
    metrics = dict(con.execute("SELECT name, value FROM metrics WHERE step = 1").fetchall())
    assert metrics["endpoint/errors"] == 2
    con.close()
