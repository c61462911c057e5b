"""``export --format otlp``: a run as OpenTelemetry spans over OTLP/HTTP (storage/otlp_export.py),
sent to a real HTTP server on loopback that decodes each request with opentelemetry-proto: every
turn's action and observation, every reward component and the trajectory's identity arrive;
429 with Retry-After is retried after the wait it names; a refusal is an error naming the
endpoint and its status."""
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse)

from storage import queries
from storage.export import Filters
from storage.otlp_export import ExportError, export_otlp, post

STORE = Path(__file__).resolve().parent.parent / "sample_runs" / "apps_tiny.duckdb"


class _Peer:
    """An OTLP/HTTP trace endpoint on loopback: answers ``script`` (status, headers) in turn,
    then 200, and keeps every request it accepted, decoded."""

    def __init__(self, script=()):
        self.script, self.requests, self.headers = list(script), [], []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                peer.headers.append(dict(self.headers))
                if peer.script:
                    status, extra = peer.script.pop(0)
                    self.send_response(status)
                    for k, v in extra.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest()
                req.ParseFromString(gzip.decompress(body))
                peer.requests.append(req)
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def spans(self):
        return [(rs, s) for r in self.requests for rs in r.resource_spans
                for ss in rs.scope_spans for s in ss.spans]


def _attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which)
    return out


@pytest.fixture
def peer():
    p = _Peer()
    yield p
    p.server.shutdown()


def test_every_turn_and_reward_of_a_run_arrives_as_genai_spans(peer):
    run = queries.runs(STORE)["run_id"].iloc[0]
    trajs = queries.trajectories(STORE, run)
    sent, rejected = export_otlp(STORE, run, peer.url, Filters(step_max=int(trajs["step"].min())))
    picked = trajs[trajs["step"] == trajs["step"].min()]
    assert (sent, rejected) == (len(picked), 0)
    spans = peer.spans()
    resource = {kv.key: kv.value.string_value for kv in spans[0][0].resource.attributes}
    assert resource["rl.run.id"] == run and resource["service.name"] == "agentrl"
    roots = {_attrs(s)["agentrl.traj_id"]: s for _, s in spans if s.name == "rl.sample"}
    assert set(roots) == set(picked["traj_id"])
    turns = queries.turns(STORE, run, list(picked["traj_id"]))
    rewards = queries.rewards(STORE, run, list(picked["traj_id"]))
    for tid, root in roots.items():
        a, row = _attrs(root), picked[picked["traj_id"] == tid].iloc[0]
        assert a["agentrl.reward"] == pytest.approx(row["reward"])
        assert a["agentrl.task_id"] == row["task_id"] and a["gen_ai.conversation.id"] == tid
        mine = rewards[rewards["traj_id"] == tid]
        assert {k[len("rl.reward."):]: v for k, v in a.items() if k.startswith("rl.reward.")} \
            == pytest.approx(dict(zip(mine["component"], mine["value"])))
        children = [s for _, s in spans if s.trace_id == root.trace_id and s is not root]
        assert all(s.parent_span_id == root.span_id for s in children)
        # the task on every span: a receiver handed any one of them names the task
        assert all(_attrs(s).get("agentrl.task_id") == row["task_id"] for s in children)
        chats = sorted((s for s in children if s.name.startswith("chat ")),
                       key=lambda s: s.start_time_unix_nano)
        tools = sorted((s for s in children if s.name == "execute_tool"),
                       key=lambda s: s.start_time_unix_nano)
        want = turns[turns["traj_id"] == tid].sort_values("turn")
        assert [json.loads(_attrs(s)["gen_ai.output.messages"])[0]["parts"][0]["content"]
                for s in chats] == want["action"].tolist()
        assert [_attrs(s)["gen_ai.tool.call.result"] for s in tools] == \
            [o for o in want["observation"].fillna("") if o]
    # re-exporting sends the same ids: a receiver sees the same traces, not new ones
    first = {(s.trace_id, s.span_id) for _, s in spans}
    peer.requests.clear()
    export_otlp(STORE, run, peer.url, Filters(step_max=int(trajs["step"].min())))
    assert {(s.trace_id, s.span_id) for _, s in peer.spans()} == first
    assert peer.headers[-1]["Content-Encoding"] == "gzip"


def test_429_is_retried_after_the_wait_it_names_and_a_refusal_names_the_endpoint():
    waits = []
    peer = _Peer([(429, {"Retry-After": "3"}), (503, {})])
    try:
        body = ExportTraceServiceRequest().SerializeToString()
        post(peer.url, body, token="s3cret", sleep=waits.append)
        assert waits == [3.0, 4.0] and len(peer.requests) == 1   # 503 without a wait: 2^2 s
        assert peer.headers[0]["Authorization"] == "Bearer s3cret"
        peer.script = [(400, {})]
        with pytest.raises(ExportError, match=rf"endpoint {peer.url}: HTTP 400"):
            post(peer.url, body, sleep=waits.append)
    finally:
        peer.server.shutdown()
    with pytest.raises(ExportError, match="only http"):
        post("file:///etc/passwd", b"")
    with pytest.raises(ExportError, match="endpoint http://127.0.0.1:9/v1/traces"):
        post("http://127.0.0.1:9/v1/traces", b"", timeout=2, sleep=lambda s: None)


def test_the_export_command_sends_a_run_and_names_what_is_missing(peer):
    import subprocess
    import sys
    run = queries.runs(STORE)["run_id"].iloc[0]
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "storage.io", "export", "--db", str(STORE), "--run", run,
           "--format", "otlp", "--step-max", "0"]
    missing = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "--endpoint is required" in missing.stderr
    done = subprocess.run(cmd + ["--endpoint", peer.url], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**__import__("os").environ,
                                                       "AGENTRL_OTLP_TOKEN": "tok"})
    n = int((queries.trajectories(STORE, run)["step"] <= 0).sum())
    assert done.returncode == 0 and f"sent {n} trajectories" in done.stdout
    assert peer.headers[-1]["Authorization"] == "Bearer tok"


def test_a_run_exported_as_spans_comes_back_through_the_receiver_with_nothing_lost(tmp_path):
    """export --format otlp -> agentrl otlp: the same trajectories, turn by turn (actions and
    observations), with their rewards, reward components, success and identity."""
    from storage.otlp import Bounds, Receiver
    run = queries.runs(STORE)["run_id"].iloc[0]
    trajs = queries.trajectories(STORE, run)
    first = int(trajs["step"].min())
    picked = trajs[trajs["step"] == first]
    receiver = Receiver(tmp_path / "back.duckdb", port=0, run_id="back",
                        bounds=Bounds(flush_s=0.05, grace_s=0.05, idle_s=0.5)).start()
    try:
        sent, rejected = export_otlp(STORE, run, receiver.url + "/v1/traces",
                                     Filters(step_max=first))
    finally:
        receiver.stop()
    assert (sent, rejected) == (len(picked), 0)
    back = queries.trajectories(tmp_path / "back.duckdb", "back")
    assert len(back) == len(picked)
    ids = list(picked["traj_id"])
    want_turns = queries.turns(STORE, run, ids)
    got_turns = queries.turns(tmp_path / "back.duckdb", "back", list(back["traj_id"]))
    want_rewards = queries.rewards(STORE, run, ids)
    got_rewards = queries.rewards(tmp_path / "back.duckdb", "back", list(back["traj_id"]))
    by_task = {}
    for _, row in back.iterrows():
        by_task.setdefault(row["task_id"], []).append(row)
    for _, row in picked.iterrows():
        mine = [b for b in by_task[row["task_id"]] if b["group_id"] == row["group_id"]
                and b["reward"] == pytest.approx(row["reward"])]
        assert mine, row["traj_id"]
        b = mine[0]
        assert (b["success"], b["step"], b["split"]) == (row["success"], row["step"], row["split"])
        assert b["prompt"] == row["prompt"]
        w = want_turns[want_turns["traj_id"] == row["traj_id"]].sort_values("turn")
        g = got_turns[got_turns["traj_id"] == b["traj_id"]].sort_values("turn")
        assert g["action"].tolist() == w["action"].tolist()
        assert g["observation"].fillna("").tolist() == w["observation"].fillna("").tolist()
        wr = want_rewards[want_rewards["traj_id"] == row["traj_id"]]
        gr = got_rewards[got_rewards["traj_id"] == b["traj_id"]]
        assert dict(zip(gr["component"], gr["value"])) == pytest.approx(
            dict(zip(wr["component"], wr["value"])))
