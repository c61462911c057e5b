"""The OTLP receiver's speed, memory and latency (issue 49), on this machine's cores.

    .venv/bin/python bench/otlp.py [--agents 20] [--traces 50] [--hostile] [--new-connection] [--team]
                                   [--throughput-only] [--rounds N] [--kill S]

The receiver runs as ``python -m storage.otlp`` in its own process (so its RSS is its own);
agents are threads that POST protobuf bodies made by the SDK's own encoder (each a trace of
one root, LLM spans in GenAI span mode and tool spans, like tests/test_otlp_clients.py's agent
records), one body per turn as a BatchSpanProcessor would send them, each agent on one kept-alive
connection as the SDK's exporter (a ``requests.Session``) keeps it. Printed, each beside its
target:

* spans/s: all agents' spans from the first POST until every one is in the ``spans`` table
  and every turn in a trajectory (the bodies are encoded before the clock starts); beside it
  the acknowledged spans/s (until the last 200: each acknowledged span is committed, so this
  is the durable store's speed, derivation aside), the receiver's CPU time (its deriving
  process's included) and the
  agents' (they share the machine's cores with it) and the load (``os.getloadavg``);
* memory: the receiver's RSS before and after 1,000 traces left open (no root, never idle);
* export-to-page latency: from a turn's POST until storage.db.reading sees the trajectory with
  that turn (what a page reads), median and max over 20 turns;
* with --hostile: a 1M-span trace (100 bodies of 10k spans), its time, rejections and RSS;
* with --kill S: 20 agents post for S seconds, then the receiver is killed with SIGKILL: spans
  it answered 200 to that are not in the store (acknowledged but lost, goal 0); then a new
  receiver starts on the store, and the trajectories still open once it has derived what was
  pending (goal 0).
"""
from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from storage import db as store  # noqa: E402


def _kv(span, key, value):
    kv = span.attributes.add()
    kv.key = key
    if isinstance(value, str):
        kv.value.string_value = value
    elif isinstance(value, float):
        kv.value.double_value = value
    else:
        kv.value.int_value = value


def body(service: str, trace_id: bytes, spans: list[dict]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    r = rs.resource.attributes.add()
    r.key, r.value.string_value = "service.name", service
    ss = rs.scope_spans.add()
    for s in spans:
        span = ss.spans.add()
        span.trace_id, span.span_id, span.name = trace_id, s["id"], s["name"]
        span.parent_span_id = s.get("parent", b"")
        span.start_time_unix_nano, span.end_time_unix_nano = s["start"], s["start"] + 1000
        for k, v in s["attrs"].items():
            _kv(span, k, v)
    return req.SerializeToString()


def turn_spans(turn: int, root: bytes, t0: int) -> list[dict]:
    msgs = [{"role": "user", "parts": [{"type": "text", "content": "What is (2+3)*4?"}]}]
    out = [{"type": "tool_call", "id": f"c{turn}", "name": "add", "arguments": {"x": 2, "y": 3}}]
    return [
        {"id": os.urandom(8), "parent": root, "name": "chat tiny", "start": t0 + turn * 10_000,
         "attrs": {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny",
                   "gen_ai.usage.input_tokens": 40 + turn, "gen_ai.usage.output_tokens": 12,
                   "gen_ai.input.messages": json.dumps(msgs),
                   "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": out}])}},
        {"id": os.urandom(8), "parent": root, "name": "execute_tool add",
         "start": t0 + turn * 10_000 + 5000,
         "attrs": {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "add",
                   "gen_ai.tool.call.id": f"c{turn}", "gen_ai.tool.call.result": "5"}}]


class Client:
    """One agent's exporter: a kept-alive connection, as the SDK's OTLP/HTTP exporter keeps
    its ``requests.Session`` (``keep_alive=False``: a new connection per POST, the bench's
    former client, which measured connection setup and a thread start per body)."""

    def __init__(self, port: int, keep_alive: bool = True):
        self.port, self.keep_alive, self.con = port, keep_alive, None

    def post(self, payload: bytes) -> int:
        for _ in range(100):
            if self.con is None:
                self.con = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            try:
                self.con.request("POST", "/v1/traces", payload,
                                 {"Content-Type": "application/x-protobuf"})
                resp = self.con.getresponse()
                resp.read()
            except (ConnectionError, http.client.HTTPException):
                self.close()  # the server closed a kept-alive connection: open another
                continue
            if not self.keep_alive or resp.will_close:
                self.close()
            if resp.status not in (429, 503):
                return resp.status
            time.sleep(float(resp.getheader("Retry-After") or 1))
        raise RuntimeError("receiver stayed behind")

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def post(port: int, payload: bytes) -> int:
    """One POST on a connection of its own."""
    client = Client(port, keep_alive=False)
    try:
        return client.post(payload)
    finally:
        client.close()


def start(db: Path, *extra: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "storage.otlp", "--db", str(db), "--port",
                             str(port), *extra], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    return proc, port


def count(db: Path, sql: str):
    with store.reading(db) as con:
        return con.execute(sql).fetchone()[0]


def payloads(a: int, traces: int, turns: int, batched: bool) -> list[bytes]:
    """Agent ``a``'s bodies: ``traces`` traces of ``turns`` turns (2 spans each) and a root, one
    body per trace (``batched``) or per turn."""
    t0, out = time.time_ns(), []
    for _ in range(traces):
        tid, root = os.urandom(16), os.urandom(8)
        bodies = [turn_spans(turn, root, t0) for turn in range(turns)]
        bodies.append([{"id": root, "name": "invoke_agent", "start": t0,
                        "attrs": {"agentrl.reward": 1.0}}])
        out += [body(f"agent-{a}", tid, spans)
                for spans in ([sum(bodies, [])] if batched else bodies)]
    return out


def post_all(port: int, made: list[list[bytes]], keep_alive: bool = True) -> None:
    """Each agent's bodies posted in order from a thread of its own, each POST after the last's
    answer, as an exporter does."""
    def agent(a: int):
        client = Client(port, keep_alive)
        for payload in made[a]:
            status = client.post(payload)
            if status != 200:
                raise RuntimeError(f"agent {a}: answered {status}")
        client.close()

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(len(made))]
    [t.start() for t in threads]
    [t.join() for t in threads]


def ceiling(agents: int, traces: int, batched: bool, decoding: bool, turns: int = 4) -> dict:
    """spans/s acknowledged by bench/otlp_ceiling.py (the receiver's server, storing nothing)
    for the same bodies from the same clients: what this machine allows the receiver at best."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "otlp_ceiling.py"), "--port",
                             str(port)] + (["--decode"] if decoding else []),
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        made = [payloads(a, traces, turns, batched) for a in range(agents)]
        spans = agents * traces * (1 + 2 * turns)
        cpu = psutil.Process(proc.pid).cpu_times()
        load = os.getloadavg()[0]
        started = time.perf_counter()
        post_all(port, made)
        took = time.perf_counter() - started
        used = psutil.Process(proc.pid).cpu_times()
    finally:
        proc.send_signal(2)
        proc.wait(30)
    return {"spans": spans, "acked_per_s": spans / took, "load": load,
            "server_cpu_s": used.user + used.system - cpu.user - cpu.system}


def throughput(tmp: Path, agents: int, traces: int, turns: int = 4, batched: bool = False,
               keep_alive: bool = True, team_catalog: str | None = None) -> dict:
    """``batched``: one body per trace (as a BatchSpanProcessor sends an agent's spans), else
    one body per turn (as a SimpleSpanProcessor does). The bodies are made before the clock
    starts (the agents' own work is not the receiver's). The clients share this machine's
    cores with the receiver: ``receiver_cpu_s`` is the receiver process's own CPU time over
    the run, so ``spans / receiver_cpu_s`` is what one core of receiver takes, clients apart."""
    db = tmp / f"speed{int(batched)}.duckdb"
    if team_catalog:                     # a team store (docs/team-store.md) instead of a file
        from storage import team_store
        db = team_store.init(tmp / f"team{int(batched)}-{os.urandom(4).hex()}", team_catalog)
    proc, port = start(db)
    expected = agents * traces * (1 + 2 * turns)
    made = [payloads(a, traces, turns, batched) for a in range(agents)]
    cpu, mine = psutil.Process(proc.pid).cpu_times(), psutil.Process().cpu_times()
    load = os.getloadavg()[0]
    started = time.perf_counter()
    post_all(port, made, keep_alive)
    posted = time.perf_counter() - started
    turns_expected = agents * traces * turns
    while count(db, "SELECT count(*) FROM spans") < expected or count(
            db, "SELECT coalesce(sum(num_turns), 0) FROM trajectories") < turns_expected:
        time.sleep(0.1)
    stored = time.perf_counter() - started
    used, agents_used = psutil.Process(proc.pid).cpu_times(), psutil.Process().cpu_times()
    cpu_s = used.user + used.system - cpu.user - cpu.system + sum(  # its deriving process
        c.cpu_times().user + c.cpu_times().system for c in psutil.Process(proc.pid).children())
    agents_cpu_s = agents_used.user + agents_used.system - mine.user - mine.system
    rss = psutil.Process(proc.pid).memory_info().rss
    proc.send_signal(2)
    proc.wait(60)
    return {"spans": expected, "posted_s": posted, "stored_s": stored,
            "spans_per_s": expected / stored, "acked_per_s": expected / posted,
            "rss_mb": rss / 2**20, "receiver_cpu_s": cpu_s, "agents_cpu_s": agents_cpu_s,
            "load": load,
            "trajectories": count(db, "SELECT count(*) FROM trajectories"),
            "stored_spans": count(db, "SELECT count(*) FROM spans")}


def open_traces(tmp: Path, n: int = 1000) -> dict:
    db = tmp / "open.duckdb"
    proc, port = start(db, "--idle-s", "3600")
    before = psutil.Process(proc.pid).memory_info().rss
    t0 = time.time_ns()
    for i in range(n):  # no root: every one stays open
        post(port, body("open", os.urandom(16), turn_spans(0, os.urandom(8), t0)
                        + turn_spans(1, os.urandom(8), t0)))
    time.sleep(2)
    after = psutil.Process(proc.pid).memory_info().rss
    proc.send_signal(2)
    proc.wait(120)
    return {"open": n, "rss_before_mb": before / 2**20, "rss_after_mb": after / 2**20,
            "per_trace_kb": (after - before) / n / 1024,
            "written_on_exit": count(db, "SELECT count(*) FROM trajectories")}


def latency(tmp: Path, turns: int = 20) -> dict:
    db = tmp / "latency.duckdb"
    proc, port = start(db)
    tid, root, t0 = os.urandom(16), os.urandom(8), time.time_ns()
    waits = []
    for turn in range(turns):
        sent = time.perf_counter()
        post(port, body("live", tid, turn_spans(turn, root, t0)))
        while True:
            try:
                if count(db, "SELECT coalesce(max(num_turns), 0) FROM trajectories") > turn:
                    break
            except Exception:
                pass
            time.sleep(0.01)
        waits.append(time.perf_counter() - sent)
    proc.send_signal(2)
    proc.wait(60)
    return {"median_s": statistics.median(waits), "max_s": max(waits)}


def million(tmp: Path) -> dict:
    db = tmp / "million.duckdb"
    proc, port = start(db)
    tid, root, t0 = os.urandom(16), os.urandom(8), time.time_ns()
    started, peak = time.perf_counter(), 0
    for _ in range(100):
        spans = [{"id": os.urandom(8), "parent": root, "name": "step", "start": t0,
                  "attrs": {"i": random.randrange(1 << 30)}} for _ in range(10_000)]
        post(port, body("million", tid, spans))
        peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
    took = time.perf_counter() - started
    proc.send_signal(2)
    out, _ = proc.communicate(timeout=120)
    return {"seconds": took, "peak_rss_mb": peak / 2**20, "summary": out.strip().splitlines()[-1],
            "stored_spans": count(db, "SELECT count(*) FROM spans")}


def killed(tmp: Path, agents: int, seconds: float) -> dict:
    """Acknowledged-but-lost spans after a kill -9 mid-load, and what a restart leaves open."""
    db = tmp / "killed.duckdb"
    proc, port = start(db)
    acked: list[set] = [set() for _ in range(agents)]
    deadline = time.monotonic() + seconds

    def agent(a: int) -> None:
        con = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        t0 = time.time_ns()
        while time.monotonic() < deadline + 5:
            tid, root = os.urandom(16), os.urandom(8)
            for turn in range(4):
                spans = turn_spans(turn, root, t0)
                try:
                    con.request("POST", "/v1/traces", body(f"agent-{a}", tid, spans),
                                {"Content-Type": "application/x-protobuf"})
                    resp = con.getresponse()
                    resp.read()
                except (OSError, http.client.HTTPException):
                    return  # the receiver is gone
                if resp.status == 200:
                    acked[a] |= {(tid.hex(), s["id"].hex()) for s in spans}
                elif resp.status in (429, 503):
                    time.sleep(0.2)

    threads = [threading.Thread(target=agent, args=(a,)) for a in range(agents)]
    [t.start() for t in threads]
    time.sleep(seconds)
    proc.kill()
    proc.wait(30)
    [t.join() for t in threads]
    sent = set().union(*acked)
    with store.reading(db) as con:
        stored = set(con.execute("SELECT trace_id, span_id FROM spans").fetchall())
    proc, port = start(db)  # derives what the killed one had not, and closes what it left open
    time.sleep(3)
    open_after = count(db, "SELECT count(*) FROM trajectories WHERE "
                           "coalesce(TRY_CAST(info->'otel'->>'open' AS BOOLEAN), FALSE)")
    traj = count(db, "SELECT count(*) FROM trajectories")
    proc.send_signal(2)
    proc.wait(120)
    return {"acked": len(sent), "lost": len(sent - stored), "stored": len(stored),
            "open_after_restart": open_after, "trajectories": traj}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--traces", type=int, default=50)
    p.add_argument("--hostile", action="store_true")
    p.add_argument("--kill", type=float, metavar="S",
                   help="only the kill -9 check: agents post for S seconds, then SIGKILL")
    p.add_argument("--throughput-only", action="store_true",
                   help="only the spans/s figures (no open traces, latency, hostile)")
    p.add_argument("--rounds", type=int, default=1, help="spans/s measured this many times")
    p.add_argument("--team", action="store_true",
                   help="also measure spans/s into a team store (docs/team-store.md) on a "
                        "PostgreSQL server of its own (tests/pg_server.py), a new database each "
                        "time")
    p.add_argument("--new-connection", action="store_true",
                   help="each POST on a connection of its own (the default keeps one per agent, "
                        "as the SDK's exporter does)")
    p.add_argument("--ceiling", action="store_true",
                   help="only the ceiling: spans/s acknowledged by the receiver's server storing "
                        "nothing (bench/otlp_ceiling.py), without and with decoding, beside the "
                        "receiver's, for both body sizes, --rounds times")
    args = p.parse_args()
    if args.ceiling:
        for _ in range(args.rounds):
            for batched in (False, True):
                bare = ceiling(args.agents, args.traces, batched, False)
                decoded = ceiling(args.agents, args.traces, batched, True)
                with tempfile.TemporaryDirectory() as d:
                    t = throughput(Path(d), args.agents, args.traces, batched=batched)
                print(f"{'a body per trace' if batched else 'a body per turn '}: acknowledged "
                      f"spans/s: server storing nothing {bare['acked_per_s']:6.0f} (load "
                      f"{bare['load']:.1f}, server CPU {bare['server_cpu_s']:.1f} s); + decoding "
                      f"{decoded['acked_per_s']:6.0f} (CPU {decoded['server_cpu_s']:.1f} s); "
                      f"the receiver {t['acked_per_s']:6.0f} (CPU {t['receiver_cpu_s']:.1f} s), "
                      f"all in trajectories {t['spans_per_s']:6.0f}; floor 10000; "
                      f"{bare['spans']} spans, {args.agents} agents", flush=True)
        return
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if args.kill:
            load = os.getloadavg()[0]
            k = killed(tmp, args.agents, args.kill)
            print(f"kill -9 at {args.kill:g} s (load {load:.1f}): {k['acked']} spans acknowledged, "
                  f"{k['stored']} "
                  f"stored, {k['lost']} acknowledged but lost (goal 0); after a restart "
                  f"{k['trajectories']} trajectories, {k['open_after_restart']} still open "
                  "(goal 0)")
            return
        server = contextlib.ExitStack()
        new_catalog = None
        if args.team:
            from tests.pg_server import postgres
            new_catalog = server.enter_context(postgres())
        kinds = [False] + ([True] if args.team else [])
        for _ in range(args.rounds):
            for batched, team in [(b, k) for b in (False, True) for k in kinds]:
                catalog = new_catalog() if team else None
                t = throughput(tmp, args.agents, args.traces, batched=batched,
                               keep_alive=not args.new_connection, team_catalog=catalog)
                print(f"{'team store' if catalog else 'file store'}: "
                      f"spans/s        {t['spans_per_s']:8.0f}   floor >= 10000   ratio "
                      f"{t['spans_per_s'] / 10000:.2f}  "
                      f"({'a body per trace' if batched else 'a body per turn'}: "
                      f"{t['spans']} spans from {args.agents} agents, load {t['load']:.1f}; all "
                      f"acknowledged (committed) at {t['posted_s']:.1f} s = "
                      f"{t['acked_per_s']:.0f} spans/s, all in trajectories at "
                      f"{t['stored_s']:.1f} s; stored {t['stored_spans']}, "
                      f"{t['trajectories']} trajectories; RSS {t['rss_mb']:.0f} MB; CPU: receiver "
                      f"{t['receiver_cpu_s']:.1f} s = {t['spans'] / t['receiver_cpu_s']:.0f} spans "
                      f"per CPU-second, agents {t['agents_cpu_s']:.1f} s)", flush=True)
        server.close()                           # the PostgreSQL server, when --team started one
        if args.throughput_only:
            return
        o = open_traces(tmp)
        print(f"open traces    {o['open']:8d}   RSS {o['rss_before_mb']:.0f} -> "
              f"{o['rss_after_mb']:.0f} MB ({o['per_trace_kb']:.1f} KB each); "
              f"{o['written_on_exit']} written on SIGINT")
        lat = latency(tmp)
        print(f"export->page   {lat['median_s']:8.2f} s median, {lat['max_s']:.2f} s max "
              f"(load {os.getloadavg()[0]:.1f})  "
              f"target <= 2 s   ratio {lat['max_s'] / 2:.2f}")
        if args.hostile:
            m = million(tmp)
            print(f"1M-span trace  {m['seconds']:8.1f} s, peak RSS {m['peak_rss_mb']:.0f} MB, "
                  f"stored {m['stored_spans']}; {m['summary']}")


if __name__ == "__main__":
    main()
