"""Importing Inspect AI logs (storage/ingest/inspect_log.py, storage/ingest/inspect_import.py): real logs made at
test time by inspect-ai with its offline mockllm model (tests/inspect_logs.py, in its own
process), and hostile logs made from them."""
import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from storage import db, ingest, io
from storage.ingest.inspect_import import import_inspect
from storage.ingest.inspect_log import finished
from storage.ingest.inspect_scores import value_to_float
from storage.ingest.messages import MAX_MESSAGE_CHARS
from storage.ingest.zip_members import Archive

ROOT = Path(__file__).resolve().parent.parent
NEEDS = "inspect-ai is optional and not installed: make extras (make test installs it)"
EPOCHS = ("epoch1", "epoch2")
SAMPLES = ("solved", "failed", "errored", "limited")


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    pytest.importorskip("inspect_ai", reason=NEEDS)
    out = tmp_path_factory.mktemp("inspect")
    # the tokenizer file mockllm would download is never asked for (every output has its usage);
    # an empty cache makes any attempt fail fast instead of passing on a machine that has it
    env = {**os.environ, "TIKTOKEN_CACHE_DIR": str(out / "empty-cache"), "INSPECT_DISPLAY": "none"}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "inspect_logs.py"), str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return out, summary


def _one(directory: Path) -> Path:
    (found,) = [p for p in directory.iterdir() if p.suffix in (".eval", ".json")]
    return found


def _q(store, sql, params=()):
    with db.reading(store) as con:
        return con.execute(sql, list(params)).df()


def _cli(source, store, *extra):
    return io.main(["import", str(source), "--db", str(store), *extra])


def _rewrite(src: Path, dst: Path, changes: dict) -> None:
    """``src`` as a deflate zip (as older Inspect wrote) with members replaced."""
    with Archive(src) as archive, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as out:
        for name in archive.members:
            out.writestr(name, changes.get(name, archive.read(name)))


# -- a real log ----------------------------------------------------------------------------------
def test_eval_log_is_one_trajectory_per_sample_and_epoch(logs, tmp_path, capsys):
    out, summary = logs
    log = _one(out / "eval")
    store = tmp_path / "s.duckdb"
    assert _cli(log, store) == 0  # the format is guessed from .eval
    assert "8 records read, 8 imported" in capsys.readouterr().out
    run_id = ingest.default_run_id(log)
    t = _q(store, "SELECT * FROM trajectories WHERE run_id = ?", [run_id]).set_index("traj_id")
    assert set(t.index) == {f"{s}:{e}" for s in SAMPLES for e in EPOCHS}
    assert (t["task_id"] == t["group_id"]).all() and (t["split"] == "eval").all()
    assert t.groupby("group_id").size().to_dict() == {s: 2 for s in SAMPLES}  # epochs side by side
    by = t.loc[[f"{s}:epoch1" for s in SAMPLES]]
    assert by["success"].tolist() == [True, False, False, False]
    assert by["reward"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert by["finish_reason"].tolist() == ["answered", "answered", "error", "message_limit"]
    assert by["failure_class"].tolist() == ["success", "tool_error_unrecovered", "sample_error",
                                            "limit_exceeded"]
    assert (t["response_tokens"] == 7 * t["num_turns"]).all()  # the eval model's output tokens
    # scores: every scorer a component, by Inspect's conversion; the four standard ones for all
    r = _q(store, "SELECT traj_id, component, value FROM rewards WHERE run_id = ?", [run_id])
    comp = r.pivot(index="traj_id", columns="component", values="value")
    assert comp[["outcome", "format", "cost", "process"]].notna().all().all()
    inspect_scores = summary["eval"][log.name]["samples"]
    for traj_id, sample in inspect_scores.items():
        scores = sample["scores"]
        assert (t.loc[traj_id, "finish_reason"] == "error") == sample["error"]
        limited = t.loc[traj_id, "finish_reason"] == "message_limit"
        assert limited == (sample["limit"] == "message")
        for name, value in scores.items():
            values = value if isinstance(value, dict) else {None: value}
            for key, v in values.items():
                column = f"score/{name}" + (f"/{key}" if key else "")
                assert comp.loc[traj_id, column] == value_to_float(v)[0], (traj_id, column)
        if not scores:  # the errored samples were not scored
            assert comp.loc[traj_id].filter(like="score/").isna().all()
    assert comp.loc["limited:epoch1", "score/style/short"] == 1.0  # "yes"
    assert comp.loc["failed:epoch1", "score/style/calls"] == 0.25
    # turns: the assistant messages are actions, tool results observations
    turns = _q(store, "SELECT traj_id, turn, action, observation, action_type, error FROM turns "
                      "WHERE run_id = ? ORDER BY traj_id, turn", [run_id])
    solved = turns[turns.traj_id == "solved:epoch1"]
    assert solved.action.tolist() == ["tool call for tool add\nadd(x=2, y=3)", "The answer is 5"]
    assert solved.observation.tolist() == ["add -> 5\n", ""]
    assert solved.action_type.tolist() == ["tool", "answer"]
    failed = turns[turns.traj_id == "failed:epoch1"].iloc[0]
    assert failed.observation == "divide -> error: division by zero\n"
    assert failed.error == "division by zero"
    errored = turns[turns.traj_id == "errored:epoch1"].iloc[-1]
    assert "sample error" in errored.error and "backend is down" in errored.error
    assert (turns[turns.traj_id == "limited:epoch1"].action.str.contains(r"add\(x=")).all()
    call = _q(store, "SELECT parsed FROM turns WHERE run_id = ? AND traj_id = 'solved:epoch1' "
                     "AND turn = 0", [run_id]).parsed[0]
    (data,) = json.loads(call)["tool_calls"]  # the call as data, for Replay
    assert (data["function"], data["arguments"]) == ("add", {"x": 2, "y": 3})
    info = json.loads(t.loc["solved:epoch1", "info"])
    assert info["tools_offered"] and info["inspect"]["tools"] == ["add", "divide", "crash"]
    # tokens: prompt, actions and observations in order; nothing trained
    tok = _q(store, "SELECT role, text, trained FROM tokens WHERE run_id = ? AND traj_id = ? "
                    "ORDER BY pos", [run_id, "solved:epoch1"])
    assert "".join(tok.text) == ("user: solved: what is 2+3?\ntool call for tool add\n"
                                 "add(x=2, y=3)add -> 5\nThe answer is 5")
    assert set(tok.role) == {"prompt", "action", "observation"} and not tok.trained.any()
    # config and metrics: Inspect's own figures carried over and matched by ours
    cfg = json.loads(_q(store, "SELECT config FROM runs WHERE run_id = ?", [run_id]).config[0])
    assert (cfg["env"], cfg["model"], cfg["algo"]) == ("inspect:arith", "mockllm/model", "none")
    assert cfg["inspect"]["eval"]["config"]["message_limit"] == 6
    m = _q(store, "SELECT name, value FROM metrics WHERE run_id = ?", [run_id])
    m = dict(zip(m.name, m.value))
    usage = summary["eval"][log.name]["usage"]["mockllm/model"]
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert m[f"usage/{key}"] == usage[key]
    for name, value in summary["eval"][log.name]["metrics"].items():
        assert m[f"inspect/{name}"] == pytest.approx(value)
    assert m["eval/success"] == 0.25 and m["eval/errors"] == 2 and m["eval/limits"] == 2
    assert m["eval/samples"] == 8


def test_json_log_imports_as_the_eval_log_does(logs, tmp_path):
    out, _ = logs
    store = tmp_path / "s.duckdb"
    for d in ("eval", "json"):
        assert _cli(_one(out / d), store) == 0
    cols = ("traj_id, reward, success, finish_reason, failure_class, num_turns, answer, "
            "response_tokens")
    runs = [ingest.default_run_id(_one(out / d)) for d in ("eval", "json")]
    a, b = (_q(store, f"SELECT {cols} FROM trajectories WHERE run_id = ? ORDER BY traj_id", [r])
            for r in runs)
    assert len(a) == 8 and a.equals(b)
    ra, rb = (_q(store, "SELECT traj_id, component, value FROM rewards WHERE run_id = ? "
                        "ORDER BY traj_id, component", [r]) for r in runs)
    assert ra.equals(rb)


def test_a_directory_of_tasks_is_one_run_per_task_and_model(logs, tmp_path, capsys):
    out, summary = logs
    store = tmp_path / "s.duckdb"
    assert _cli(out / "set", store) == 0
    runs = _q(store, "SELECT run_id, name, config FROM runs ORDER BY name")
    assert runs.name.tolist() == ["arith · mockllm/model", "count · mockllm/model"]
    base = ingest.default_run_id(out / "set")
    assert all(r.startswith(base + "-") for r in runs.run_id)
    count = runs.run_id[1]
    t = _q(store, "SELECT traj_id, finish_reason, failure_class FROM trajectories "
                  "WHERE run_id = ?", [count])
    assert t.finish_reason.tolist() == ["token_limit"] * 2
    assert set(t.failure_class) == {"limit_exceeded"}
    assert all(tid.endswith(("/c1:epoch1", "/c1:epoch2")) for tid in t.traj_id)  # eval id first
    capsys.readouterr()
    assert _cli(out / "set", store) == 0  # again: the same runs, nothing twice
    said = capsys.readouterr().out
    assert "8 records read, 0 imported, 8 already present" in said
    assert "2 records read, 0 imported, 2 already present" in said
    assert _q(store, "SELECT count(*) AS n FROM trajectories").n[0] == 10


@pytest.mark.parametrize("value, expected", [
    ("C", 1.0), ("I", 0.0), ("P", 0.5), ("N", 0.0), ("yes", 1.0), ("No", 0.0), ("TRUE", 1.0),
    ("false", 0.0), ("0.25", 0.25), ("1e3", 1000.0), ("nan", 0.0), ("inf", 0.0),
    ("maybe", 0.0), ("c", 0.0), (True, 1.0), (False, 0.0), (0, 0.0), (1, 1.0), (0.5, 0.5),
    (-3.5, -3.5)])
def test_score_conversion_is_inspects_own(value, expected):
    assert value_to_float(value)[0] == expected
    inspect_scorer = pytest.importorskip("inspect_ai.scorer", reason=NEEDS)
    assert inspect_scorer.value_to_float()(value) == expected


# -- hostile logs --------------------------------------------------------------------------------
def test_a_cut_log_imports_its_whole_samples_and_names_the_cut_one(logs, tmp_path, capsys):
    out, _ = logs
    log = _one(out / "eval")
    with Archive(log) as archive:
        members = list(archive.members.values())
    samples = [m for m in members if m.name.startswith("samples/")]
    cut_at = samples[5].offset + 60  # inside the sixth sample's data
    cut = tmp_path / "cut.eval"
    cut.write_bytes(log.read_bytes()[:cut_at])
    store = tmp_path / "s.duckdb"
    assert _cli(cut, store, "--format", "inspect") == 1
    out_err = capsys.readouterr()
    sid, epoch = samples[5].name[len("samples/"):-len(".json")].split("_epoch_")
    assert f"error: cut.eval: sample {sid} epoch {epoch}: " in out_err.err
    assert "cut short" in out_err.err
    assert "6 records read, 5 imported" in out_err.out
    cfg = json.loads(_q(store, "SELECT config FROM runs").config[0])
    assert cfg["env"] == "inspect:arith"  # from _journal/start.json: header.json was cut off
    assert finished(log) and not finished(cut)  # what a follower waits for


def test_refusals_marked_in_the_log_finish_refused(logs, tmp_path):
    out, _ = logs
    log = _one(out / "eval")
    with Archive(log) as archive:
        solved = json.loads(archive.read("samples/solved_epoch_1.json"))
        failed = json.loads(archive.read("samples/failed_epoch_2.json"))
    said = [{"type": "text", "text": "I will not do this.", "refusal": True}]
    marked = dict(solved, messages=solved["messages"][:1] + [
        {"role": "assistant", "content": said}], scores={"includes": {"value": "I"}})
    stopped = json.loads(json.dumps(failed))  # the provider's stop details say refusal
    stopped["output"]["choices"][0]["stop_details"] = {"type": "refusal", "category": "cyber"}
    edited = tmp_path / "refusals.eval"
    _rewrite(log, edited, {"samples/solved_epoch_1.json": json.dumps(marked).encode(),
                           "samples/failed_epoch_2.json": json.dumps(stopped).encode()})
    store = tmp_path / "s.duckdb"
    import_inspect(edited, store)
    t = _q(store, "SELECT traj_id, finish_reason, failure_class FROM trajectories"
           ).set_index("traj_id")
    assert t.loc["solved:epoch1"].tolist() == ["refused", "refused"]
    assert t.loc["failed:epoch2"].tolist() == ["refused", "refused"]
    assert t.loc["failed:epoch1", "failure_class"] == "tool_error_unrecovered"  # left as it was


def test_bad_members_fail_alone_naming_the_sample(logs, tmp_path, capsys):
    out, _ = logs
    log = _one(out / "eval")
    with Archive(log) as archive:
        solved2 = json.loads(archive.read("samples/solved_epoch_2.json"))
        limited2 = json.loads(archive.read("samples/limited_epoch_2.json"))
    huge = dict(solved2, messages=[{"role": "user", "content": "x" * (MAX_MESSAGE_CHARS + 1)}])
    odd_score = dict(limited2, scores={"includes": {"value": {"a": {"nested": 1}}}})
    hostile = tmp_path / "hostile.eval"
    _rewrite(log, hostile, {"samples/failed_epoch_1.json": b'{"id": "failed", "messages": [',
                            "samples/solved_epoch_2.json": json.dumps(huge),
                            "samples/limited_epoch_2.json": json.dumps(odd_score),
                            "samples/errored_epoch_2.json": b"\xff\xfe not text"})
    store = tmp_path / "s.duckdb"
    assert _cli(hostile, store) == 1
    said = capsys.readouterr()
    errors = [e for e in said.err.splitlines() if e.startswith("error: ")]
    assert len(errors) == 4
    expect = {"sample failed epoch 1: ": "not valid JSON",
              "sample solved epoch 2: ": f"over the limit of {MAX_MESSAGE_CHARS}",
              "sample limited epoch 2: ": "score 'includes' has a value Inspect does not allow",
              "sample errored epoch 2: ": "not valid JSON"}
    for where, words in expect.items():
        assert any(where in e and words in e for e in errors), (where, errors)
    assert "8 records read, 4 imported" in said.out
    t = _q(store, "SELECT traj_id FROM trajectories")
    assert set(t.traj_id) == {"solved:epoch1", "failed:epoch2", "errored:epoch1",
                              "limited:epoch1"}


def test_a_zip_bomb_stops_at_the_cap_whatever_size_it_declares(logs, tmp_path):
    out, _ = logs
    log = _one(out / "eval")
    bomb = tmp_path / "bomb.eval"
    _rewrite(log, bomb, {"samples/solved_epoch_1.json": b" " * (40 << 20)})  # 40 MB of spaces
    data = bytearray(bomb.read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0:  # its central directory entry declares 100 bytes uncompressed
        name_len = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46:at + 46 + name_len] == b"samples/solved_epoch_1.json":
            struct.pack_into("<I", data, at + 24, 100)
        at = data.find(b"PK\x01\x02", at + 4)
    bomb.write_bytes(data)
    store = tmp_path / "s.duckdb"
    result = import_inspect(bomb, store, max_member_bytes=1 << 20)
    (report,) = result.reports
    assert report.imported == 7 and report.failed == 1
    assert "sample solved epoch 1: bomb.eval: member samples/solved_epoch_1.json: more than " \
           "1048576 bytes uncompressed (the limit for one member; it declares 100)" \
           in report.errors[0]


def test_the_total_cap_stops_the_rest_with_a_clear_error(logs, tmp_path):
    out, _ = logs
    store, log = tmp_path / "s.duckdb", _one(out / "eval")
    with Archive(log) as archive:  # room for the header and three samples
        samples = [m for m in archive.members.values() if m.name.startswith("samples/")]
        room = archive.members["header.json"].size + sum(m.size for m in samples[:3])
    result = import_inspect(log, store, max_total_bytes=room + 10)
    (report,) = result.reports
    assert (report.lines, report.imported, report.failed) == (4, 3, 1)
    sid, epoch = samples[3].name[len("samples/"):-len(".json")].split("_epoch_")
    assert report.errors == [
        f"{log.name}: sample {sid} epoch {epoch}: {log.name}: its members hold more than "
        f"{room + 10} bytes uncompressed in all (the limit: 50 times its {log.stat().st_size} "
        f"bytes, 134217728 at least, {room + 10} at most); this sample and those after it "
        "are not read"]


def test_what_is_not_a_log_is_refused_by_name(logs, tmp_path, capsys):
    out, _ = logs
    store = tmp_path / "s.duckdb"
    junk = tmp_path / "junk.eval"
    junk.write_bytes(b"not a zip at all")
    assert _cli(junk, store) == 2
    assert "junk.eval: not a zip archive" in capsys.readouterr().err
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    (mixed / "junk.eval").write_bytes(b"PK\x03\x04 and then nothing")
    (mixed / "good.eval").write_bytes(_one(out / "eval").read_bytes())
    assert _cli(mixed, store) == 1  # the good log imports, the bad one is named
    said = capsys.readouterr()
    assert "error: junk.eval: could not be read" in said.err
    assert "8 records read, 8 imported" in said.out


def test_import_file_returns_the_one_run_of_a_log(logs, tmp_path):
    out, _ = logs
    store = tmp_path / "s.duckdb"
    report = ingest.import_file(_one(out / "json"), store, run_id="mine")
    assert (report.run_id, report.imported, report.failed) == ("mine", 8, 0)
    with pytest.raises(ValueError, match="holds 2 runs"):
        ingest.import_file(out / "set", store, "inspect")


def test_a_rescored_log_updates_the_scores_and_keeps_the_old_ones(logs, tmp_path, capsys):
    """``inspect score`` rewrites a log with new scores (here Inspect's own ``score`` with a
    scorer that marks every sample correct). Importing it into the run of the first import gives
    the samples already there the new scores, reward and class; the scoring they replace stays
    in ``info.rescored``; turns and tokens are untouched; importing it again changes nothing."""
    out, summary = logs
    store = tmp_path / "s.duckdb"
    assert _cli(_one(out / "eval"), store, "--run-id", "arith") == 0
    before = _q(store, "SELECT * FROM trajectories WHERE run_id = 'arith'").set_index("traj_id")
    n_turns = _q(store, "SELECT count(*) n FROM turns WHERE run_id = 'arith'").n[0]
    n_tokens = _q(store, "SELECT count(*) n FROM tokens WHERE run_id = 'arith'").n[0]
    capsys.readouterr()
    assert _cli(_one(out / "rescored"), store, "--run-id", "arith") == 0
    # every sample's scores changed (includes and style -> lenient), so all 8 are rescored
    assert "8 already present (skipped; 8 of them rescored)" in capsys.readouterr().out
    after = _q(store, "SELECT * FROM trajectories WHERE run_id = 'arith'").set_index("traj_id")
    assert len(after) == 8 and after["success"].all() and (after["reward"] == 1.0).all()
    assert int((~before["success"]).sum()) == 6                      # 6 of them flipped
    for t in before.index:
        (old,) = json.loads(after.loc[t, "info"])["rescored"]
        assert old["success"] == before.loc[t, "success"]
        assert old["failure_class"] == before.loc[t, "failure_class"]
        assert old["reward"] == before.loc[t, "reward"]
        assert ("score/includes" in old["components"]) == bool(old["scores"])  # errored: unscored
    assert set(after.loc[before.index[~before["success"]], "failure_class"]) == {"success"}
    comp = _q(store, "SELECT traj_id, component, value FROM rewards WHERE run_id = 'arith'")
    comp = comp.pivot(index="traj_id", columns="component", values="value")
    assert (comp["score/lenient"] == 1.0).all() and "score/includes" not in comp
    assert _q(store, "SELECT count(*) n FROM turns WHERE run_id = 'arith'").n[0] == n_turns
    assert _q(store, "SELECT count(*) n FROM tokens WHERE run_id = 'arith'").n[0] == n_tokens
    cfg = json.loads(_q(store, "SELECT config FROM runs WHERE run_id = 'arith'").config[0])
    assert "lenient" in json.dumps(cfg["inspect"])                  # the log as it is now
    assert _cli(_one(out / "rescored"), store, "--run-id", "arith") == 0
    assert "8 already present (skipped), 0 replaced" in capsys.readouterr().out
