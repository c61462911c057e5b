"""An OpenAI-compatible server as the policy (``--model openai:URL``), against a real HTTP server
this module starts: core/serve/server.py serving the tiny model over the chat-completions
protocol, with faults injected per request (matched by the request's seed, which identifies one
trajectory's turn). Nothing mocked: real sockets, the real CLI, a real DuckDB file, the app's pages
through AppTest.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from core.run.collection import collect
from core.config import ConfigError, TrainConfig, validate
from core.endpoint.client import (ChatClient, EndpointError, EndpointRefused, action_pieces, backoff_s,
                           chat_url, pieces, restore_stop, retry_after_s)
from core.serve.server import ChatModel, serve
from storage.recorder import Recorder
from tests.test_pages import app, demo, texts  # noqa: F401  (AppTest fixtures)

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-test-QX7f3a9c1e5b0d"
"""The API key the server demands; it must never reach a store."""
GOLD = "<think>risky</think><answer>Dragon</answer> and more"


def seed_of(step_seed: int, g: int, r: int, turn: int = 0) -> str:
    """The text a request of trajectory g/r at ``turn`` carries (core/run/collection.py's seeds)."""
    return f'"seed": {(step_seed * 1_000_003 + g * 1_009 + r) % 2 ** 31 + turn},'


@pytest.fixture(scope="module")
def model():
    return ChatModel("tiny")


@pytest.fixture(scope="module")
def server(model):
    srv = serve(model, api_key=KEY)
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def url(server):
    server.faults.rules, server.faults.seen = [], []
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


def endpoint_cfg(url: str, db: Path, **kw) -> TrainConfig:
    base = dict(env="bandit", model=f"openai:{url}", model_name="tiny", steps=1, group_size=2,
                tasks_per_step=2, max_turns=1, max_new_tokens=12, eval_every=0, db=str(db),
                endpoint_backoff=0.01, endpoint_timeout=20.0)
    base.update(kw)
    return TrainConfig(**base)


# -- pure pieces --------------------------------------------------------------------------------
def test_stop_tag_is_restored_as_the_model_wrote_it():
    tags = ("</search>", "</answer>")
    assert restore_stop("<think>x</think><answer>Paris", "stop", tags) == \
        "<think>x</think><answer>Paris</answer>"
    assert restore_stop("<answer>a</answer><search>q", "stop", tags) == \
        "<answer>a</answer><search>q</search>"
    assert restore_stop("<answer>x</answer>", "stop", tags) == "<answer>x</answer>"  # kept whole
    assert restore_stop("no tag at all", "stop", tags) == "no tag at all"              # EOS
    assert restore_stop("<answer>cut by the limit", "length", tags) == "<answer>cut by the limit"
    assert restore_stop("<search>q", "stop", tags, stop_reason="</search>") == "<search>q</search>"


def test_action_rows_are_the_servers_tokens_then_pieces():
    rows = action_pieces("<answer>Dragon</answer>", [("<", -1.0), ("answer", -2.0), (">", -0.5),
                                                     ("Dragon", -0.1)])
    assert rows == [("<", -1.0), ("answer", -2.0), (">", -0.5), ("Dragon", -0.1),
                    ("</answer>", None)]
    # tokens that do not spell the action stop the alignment; the text is never lost
    rows = action_pieces("ab cd", [("ab", -1.0), ("X", -2.0)])
    assert "".join(t for t, _ in rows) == "ab cd" and rows[0] == ("ab", -1.0)
    assert [lp for _, lp in rows[1:]] == [None]
    assert "".join(pieces(" a  b\n c \n")) == " a  b\n c \n"


def test_backoff_and_retry_after():
    assert retry_after_s("3") == 3.0 and retry_after_s("0.5") == 0.5
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
    assert retry_after_s("soon") is None and retry_after_s(None) is None
    assert backoff_s(1, 1.0) == 1.0 and backoff_s(3, 1.0) == 4.0
    assert backoff_s(10, 1.0) == 30.0                                  # capped
    assert backoff_s(1, 1.0, retry_after=7.0) == 7.0                   # the server's word
    assert backoff_s(1, 1.0, retry_after=3600.0) == 60.0               # but capped
    assert chat_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_url("http://h:1/v1/chat/completions") == "http://h:1/v1/chat/completions"


@pytest.mark.parametrize("model, name, match", [
    ("openai:http://127.0.0.1:9/v1", "", r"^model_name=''"),
    ("openai:ftp://127.0.0.1/v1", "m", r"^model='openai:ftp.*http:// or https://"),
    ("openai:http://user:secret@127.0.0.1/v1", "m", r"must not carry credentials"),
    ("openai:http://127.0.0.1/v1?key=abc", "m", r"must not carry credentials or a query"),
])
def test_bad_endpoint_configs_are_refused(model, name, match):
    with pytest.raises(ConfigError, match=match):
        validate(TrainConfig(env="bandit", model=model, model_name=name))


def test_training_flags_are_refused_by_the_cli(tmp_path, capsys):
    from core.commands.train import main
    db = tmp_path / "x.duckdb"
    common = ["--env", "bandit", "--model", "openai:http://127.0.0.1:9/v1", "--model-name", "m",
              "--db", str(db)]
    assert main(common + ["--lr", "0.01"]) == 2
    assert "lr: an endpoint policy" in capsys.readouterr().err
    assert main(common + ["--sft-steps", "3"]) == 2
    assert "sft_steps" in capsys.readouterr().err
    assert not db.exists()                                             # refused before any store


# -- the client against the server --------------------------------------------------------------
def test_logprobs_are_the_models_own(model, url):
    client = ChatClient(url, "tiny", KEY, top_logprobs=3)
    messages = [{"role": "user", "content": "Pull an arm."}]
    reply = client.complete(messages, stop=["</answer>"], max_tokens=8, temperature=0.7,
                            top_p=1.0, seed=5)
    assert reply.tokens and len(reply.tokens) <= 8 and reply.attempts == 1
    assert "".join(t for t, _ in reply.tokens) == reply.text
    assert all(len(alts) == 3 for alts in reply.top)
    # the same tokens scored by the model at the same temperature: the logprobs the server sent
    ids = model.prompt_ids(messages)
    gen = model.tokenizer.encode(reply.text, add_special_tokens=False)
    scored = [lp for lp, _ in model._score(ids, gen, 0.7)]
    if len(gen) == len(reply.tokens):  # the text re-encodes to the same tokens
        assert [round(lp, 3) for _, lp in reply.tokens] == [round(lp, 3) for lp in scored]
    # no key: the server refuses, and the error says so without a key in it
    with pytest.raises(EndpointRefused, match="HTTP 401"):
        ChatClient(url, "tiny", None).complete(messages, stop=[], max_tokens=2, temperature=0,
                                               top_p=1, seed=0)


def test_faults_are_retried_within_bounds(url, server):
    server.faults.rules = [{"fault": "500", "when": '"seed": 11,', "times": -1},
                           {"fault": "429", "when": '"seed": 12,', "times": 1, "retry_after": 1},
                           {"fault": "malformed", "when": '"seed": 13,', "times": 1}]
    client = ChatClient(url, "tiny", KEY, retries=2, backoff=0.01)
    ask = dict(stop=["</answer>"], max_tokens=4, temperature=1.0, top_p=1.0)
    messages = [{"role": "user", "content": "hi"}]
    with pytest.raises(EndpointError) as err:
        client.complete(messages, seed=11, **ask)
    assert err.value.kind == "server_error" and err.value.attempts == 3
    assert err.value.status == 500
    t0 = time.perf_counter()
    reply = client.complete(messages, seed=12, **ask)
    assert reply.attempts == 2 and time.perf_counter() - t0 >= 1.0    # Retry-After honoured
    assert client.complete(messages, seed=13, **ask).attempts == 2
    assert [s["fault"] for s in server.faults.seen].count("500") == 3  # 1 + 2 retries, no more


# -- whole runs ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cli_run(server, tmp_path_factory):
    """One run through the real command line, the key in the environment: two collection rounds
    and evaluations at steps 0 and 2; the first held-out episode answers the gold."""
    server.faults.rules = [{"fault": "reply", "when": seed_of(7, 0, 0), "times": -1,
                            "text": GOLD}]
    server.faults.seen = []
    base = tmp_path_factory.mktemp("endpoint")
    db = base / "endpoint.duckdb"
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    env = {**os.environ, "AGENTRL_OPENAI_API_KEY": KEY, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "core.train", "--env", "bandit", "--model", f"openai:{url}",
         "--model-name", "tiny", "--steps", "2", "--group-size", "2", "--tasks-per-step", "2",
         "--max-turns", "1", "--max-new-tokens", "16", "--eval-every", "2", "--eval-tasks", "2",
         "--endpoint-top-logprobs", "2", "--db", str(db), "--quiet"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = list(server.faults.seen)
    server.faults.rules = []
    con = duckdb.connect(str(db), read_only=True)
    run_id = con.execute("SELECT run_id FROM runs").fetchone()[0]
    con.close()
    return base, db, run_id, seen, proc


def test_cli_run_records_rounds_evaluations_and_logprobs(cli_run):
    base, db, run_id, seen, proc = cli_run
    assert f"run {run_id} recorded" in proc.stdout
    assert all(s["authorized"] for s in seen) and len(seen) == 2 * 4 + 2 * 2  # rounds, evals
    con = duckdb.connect(str(db), read_only=True)
    status, source, config = con.execute("SELECT status, source, config FROM runs").fetchone()
    config = json.loads(config)
    assert status == "finished" and source == "endpoint"
    assert config["model"].startswith("openai:http://127.0.0.1:") and config["model_name"] == "tiny"
    trajs = con.execute("SELECT step, traj_id, split, success, finish_reason, response_tokens, "
                        "info FROM trajectories ORDER BY step, traj_id").fetchall()
    assert [(s, split) for s, _, split, *_ in trajs] == \
        [(0, "eval")] * 2 + [(1, "collect")] * 4 + [(2, "eval")] * 2 + [(2, "collect")] * 4
    gold = [t for t in trajs if t[1] in ("e0-g0-r0", "e2-g0-r0")]
    assert len(gold) == 2 and all(t[3] and t[4] == "done" for t in gold)  # a pull ends it
    # every action row is the server's token with its logprob, except the restored stop tag
    rows = con.execute("""SELECT traj_id, role, trained, logprob, text, token_id FROM tokens
                          ORDER BY traj_id, pos""").fetchall()
    assert not any(r[2] for r in rows) and all(r[5] is None for r in rows)
    actions = [r for r in rows if r[1] == "action"]
    missing = [r for r in actions if r[3] is None]
    assert [r[4] for r in missing] == ["</answer>", "</answer>"]           # the two gold answers
    assert len(actions) - len(missing) == sum(t[5] for t in trajs) - 2
    turn = con.execute("SELECT action, info FROM turns WHERE traj_id = 'e0-g0-r0'").fetchone()
    assert turn[0] == GOLD[:GOLD.index("</answer>")] + "</answer>"
    info = json.loads(turn[1])["endpoint"]
    assert info["restored_stop"] == "</answer>" and info["finish_reason"] == "stop"
    scored = [a for a in actions if a[0] == "e0-g0-r0" and a[3] is not None]
    assert len(info["top_logprobs"]) == len(scored) and all(len(t) == 2
                                                            for t in info["top_logprobs"])
    # the context as stored: prompt, action, observation, in order
    text = "".join(r[4] for r in rows if r[0] == "e0-g0-r0")
    assert text.index("two-armed bandit") < text.index("<answer>Dragon</answer>") < \
        text.index("You pulled Dragon")
    metrics = dict(con.execute("SELECT name, value FROM metrics WHERE step = 2").fetchall())
    assert metrics["eval/success"] == 0.5 and metrics["endpoint/requests"] == 4
    assert metrics["endpoint/logprob_coverage"] == 1.0 and metrics["endpoint/errors"] == 0
    con.close()


def test_the_key_never_reaches_the_store(cli_run):
    base, db, *_ = cli_run
    files = [p for p in base.rglob("*") if p.is_file()]
    assert db in files
    for path in files:
        assert KEY.encode() not in path.read_bytes(), path


def test_pages_open_the_endpoint_run(cli_run, app):  # noqa: F811
    base, db, run_id, *_ = cli_run
    for page, title in (("runs", "Runs"), ("replay", "Replay"), ("groups", "Groups"),
                        ("dynamics", "Dynamics"), ("failures", "Failures")):
        # a link carries the parameters its page reads (pages/_params.py refuses the others)
        traj = {"traj": "s1-g0-r0"} if page == "replay" else {}
        at = app(page, store_dir=str(base), store=str(db), run=run_id, step=1, **traj)
        assert not at.exception, f"{page}: {at.exception}"
        assert at.title[0].value == title
        if page == "replay":  # a collected episode trained nothing, by design: no mask error
            issues = [i for f in at.dataframe if "issue" in f.value.columns
                      for i in f.value["issue"]]
            assert issues and not any("not trained" in i for i in issues), issues
    at = app("replay", store_dir=str(base), store=str(db), run=run_id, step=0, traj="e0-g0-r0")
    assert any("Loss mask consistent" in t for t in texts(at, "success"))


def test_faults_end_only_their_trajectory(url, server, tmp_path, capsys):
    """Step 1's four trajectories: 500 for ever, a 429 once, malformed JSON once, a timeout for
    ever. The two that fail for good end as endpoint_error with the error; the run goes on."""
    server.faults.rules = [
        {"fault": "500", "when": seed_of(1, 0, 0), "times": -1},
        {"fault": "429", "when": seed_of(1, 0, 1), "times": 1, "retry_after": 1},
        {"fault": "malformed", "when": seed_of(1, 1, 0), "times": 1},
        {"fault": "timeout", "when": seed_of(1, 1, 1), "times": -1, "delay": 7}]
    db = tmp_path / "faults.duckdb"
    # 5 s: the timeout fault's 7 s exceed it; four 4-token answers in a row on a busy machine
    # do not
    cfg = endpoint_cfg(url, db, steps=2, endpoint_retries=2, endpoint_timeout=5.0,
                       max_new_tokens=4)
    os.environ["AGENTRL_OPENAI_API_KEY"] = KEY
    try:
        recorder = Recorder(str(db))
        run_id = collect(cfg, recorder, progress=False)
        recorder.close()
    finally:
        del os.environ["AGENTRL_OPENAI_API_KEY"]
    assert "s1: 2 of 4 episodes ended as endpoint_error (first: " in capsys.readouterr().out
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == \
        "finished"
    rows = {t: (f, json.loads(i)) for t, f, i in con.execute(
        "SELECT traj_id, finish_reason, info FROM trajectories WHERE step = 1").fetchall()}
    assert rows["s1-g0-r0"][0] == "endpoint_error"
    assert rows["s1-g0-r0"][1]["endpoint_error"]["kind"] == "server_error"
    assert rows["s1-g0-r0"][1]["endpoint_error"]["attempts"] == 3
    assert rows["s1-g1-r1"][0] == "endpoint_error"
    assert rows["s1-g1-r1"][1]["endpoint_error"]["kind"] == "timeout"
    for traj in ("s1-g0-r1", "s1-g1-r0"):  # retried once, then answered
        assert rows[traj][0] != "endpoint_error" and rows[traj][1]["endpoint"]["retries"] == 1
    m = dict(con.execute("SELECT name, value FROM metrics WHERE step = 1").fetchall())
    assert m["endpoint/errors"] == 2 and m["endpoint/retries"] == 2 + 1 + 1 + 2
    assert m["env/finish/endpoint_error"] == 0.5
    # the round after is untouched
    after = con.execute("SELECT finish_reason FROM trajectories WHERE step = 2").fetchall()
    assert len(after) == 4 and ("endpoint_error",) not in after
    con.close()


def test_a_refused_key_or_no_server_is_said_before_any_run(url, tmp_path, monkeypatch, capsys):
    from core.commands.train import main
    wrong = "sk-wrong-key-55aa77"
    monkeypatch.setenv("AGENTRL_OPENAI_API_KEY", wrong)
    db = tmp_path / "refused.duckdb"
    args = ["--env", "bandit", "--model-name", "tiny", "--steps", "1", "--group-size", "2",
            "--tasks-per-step", "1", "--eval-every", "0", "--db", str(db), "--quiet",
            "--endpoint-retries", "1", "--endpoint-backoff", "0.01"]
    assert main(args + ["--model", f"openai:{url}"]) == 1
    err = capsys.readouterr().err
    assert "refused" in err and "HTTP 401" in err and wrong not in err
    nobody = "http://127.0.0.1:9/v1"                                    # nothing listens there
    assert main(args + ["--model", f"openai:{nobody}"]) == 1
    assert "cannot reach http://127.0.0.1:9/v1" in capsys.readouterr().err
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    con.close()


def test_a_key_refused_mid_run_fails_the_run_without_the_key(url, server, tmp_path,
                                                            monkeypatch):
    monkeypatch.setenv("AGENTRL_OPENAI_API_KEY", KEY)
    server.faults.rules = [{"fault": "401", "when": seed_of(1, 0, 1), "times": -1}]
    db = tmp_path / "revoked.duckdb"
    recorder = Recorder(str(db))
    with pytest.raises(EndpointRefused, match="HTTP 401"):
        collect(endpoint_cfg(url, db, max_new_tokens=4), recorder, progress=False)
    recorder.close()
    con = duckdb.connect(str(db), read_only=True)
    status, error = con.execute("SELECT status, error FROM runs").fetchone()
    con.close()
    assert status == "failed" and "HTTP 401" in error and KEY not in error
    assert KEY.encode() not in db.read_bytes()


def test_turns_carry_the_conversation(url, server, tmp_path, monkeypatch):
    """FrozenLake, two turns: the second request carries the first action and observation."""
    monkeypatch.setenv("AGENTRL_OPENAI_API_KEY", KEY)
    server.faults.rules = [{"fault": "reply", "when": '"seed": ', "times": -1,
                            "text": "<answer>Right</answer>"}]
    db = tmp_path / "lake.duckdb"
    recorder = Recorder(str(db))
    collect(endpoint_cfg(url, db, env="frozenlake", max_turns=2, group_size=1, tasks_per_step=1),
            recorder, progress=False)
    recorder.close()
    second = [s["messages"] for s in server.faults.seen if len(s["messages"] or []) > 2]
    assert second, "no second turn was asked for"
    assert [m["role"] for m in second[0]] == ["system", "user", "assistant", "user"]
    assert second[0][2]["content"] == "<answer>Right</answer>"
    con = duckdb.connect(str(db), read_only=True)
    turns = con.execute("SELECT turn, action, observation FROM turns ORDER BY turn").fetchall()
    con.close()
    assert turns[0][1] == "<answer>Right</answer>" and second[0][3]["content"] == turns[0][2]


def test_requests_in_flight_stay_within_the_pool(url, server, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_OPENAI_API_KEY", KEY)
    # earlier tests' slow faults may still be answering (for long on a loaded machine): counted
    # here they would read as this run's requests
    deadline = time.time() + 180
    while server.faults.in_flight and time.time() < deadline:
        time.sleep(0.2)
    assert server.faults.in_flight == 0, "earlier tests' requests are still in flight"
    server.faults.most_in_flight = 0
    db = tmp_path / "pool.duckdb"
    recorder = Recorder(str(db))
    collect(endpoint_cfg(url, db, group_size=3, tasks_per_step=2, max_new_tokens=4,
                         endpoint_concurrency=2), recorder, progress=False)
    recorder.close()
    assert server.faults.most_in_flight == 2                        # concurrent, and bounded
    assert len(server.faults.seen) == 6
