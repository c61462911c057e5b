"""Issue 47, point 2: an import costs what its caps allow, measured on real hostile files.

Token rows: an assistant message of 3.9M characters of ``"a "`` (a 12 KB ``.eval``) became 1.95M
token rows and 1.36 GB; its rows are now capped per text and per trajectory (the rest of the text
kept whole in the last row, the cut recorded) and made only as they are written. Memory is
measured as the peak RSS of a real ``python -m storage.io import`` child (tests/hostile_imports.py)
against the bound docs/threat-model.md states. Also: directory entries sharing one member's data,
attachments naming one text thousands of times, JSON that costs more to parse than its size says,
archives inflating far beyond their size, and the counts a line may hold.
"""
from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest

from storage import db, ingest
from storage.ingest.zip_members import MAX_RATIO, parse_cost
from storage.interchange import validate
from storage.token_rows import (MAX_BATCH_CHARS, MAX_TEXT_TOKENS, MAX_TRAJECTORY_TOKENS,
                                BatchSize, TokenRows)
from tests.hostile_imports import (kind_long_eval, kind_long_messages, kind_shared_eval,
                                   peak_import, sample, write_eval)

# docs/threat-model.md: what one import may take (the interpreter, DuckDB and pyarrow loaded
# take ~160 MB of it); measured 262 MB (one message), 233 MB (its JSONL), 562 MB (eight)
ONE_MESSAGE_MB, EIGHT_MESSAGES_MB = 400, 800


def _q(store, sql):
    with db.reading(store) as con:
        return con.execute(sql).fetchall()


def _context_is_whole(store) -> bool:
    """Concatenating the token rows by position gives the prompt, actions and observations."""
    return _q(store, """
        SELECT bool_and(ctx = p || acts) FROM (
            SELECT traj_id, string_agg(text, '' ORDER BY pos) AS ctx FROM tokens GROUP BY 1)
        JOIN (SELECT traj_id, any_value(t.prompt) AS p,
                     string_agg(u.action || u.observation, '' ORDER BY u.turn) AS acts
              FROM trajectories t JOIN turns u USING (run_id, traj_id) GROUP BY 1)
        USING (traj_id)""")[0][0]


# -- the long message ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["eval", "messages"])
def test_a_long_message_costs_its_capped_rows_not_a_row_per_word(tmp_path, kind):
    source = (kind_long_eval(tmp_path / "long.eval") if kind == "eval"
              else kind_long_messages(tmp_path / "long.jsonl"))
    store = tmp_path / "s.duckdb"
    code, peak, err = peak_import(source, store)
    assert code == 0, err
    assert peak < ONE_MESSAGE_MB, peak  # was 1,360 MB
    (rows, longest), = _q(store, "SELECT count(*), max(length(text)) FROM tokens")
    assert MAX_TEXT_TOKENS < rows < MAX_TEXT_TOKENS + 20  # not 1.95M
    assert longest > 3_800_000  # the rest of the message, whole, in its last row
    assert _context_is_whole(store)
    info = json.loads(_q(store, "SELECT info FROM trajectories")[0][0])
    (cut,) = info["token_rows_cut"]
    assert (cut["role"], cut["rows"], cut["chars"]) == ("action", MAX_TEXT_TOKENS, longest)
    assert any("token rows capped in 1 text(s)" in n for n in info["import_notes"])


def test_eight_long_messages_in_a_small_eval_finish_in_seconds_within_the_bound(tmp_path):
    source = kind_long_eval(tmp_path / "eight.eval", messages=8)
    started = time.monotonic()
    code, peak, err = peak_import(source, tmp_path / "s.duckdb", timeout=120)
    assert code == 0, err
    assert peak < EIGHT_MESSAGES_MB and time.monotonic() - started < 60, peak  # did not finish
    assert _q(tmp_path / "s.duckdb", "SELECT count(*) FROM trajectories") == [(8,)]  # in 300 s


# -- zips ---------------------------------------------------------------------------------------
def test_entries_sharing_one_members_data_are_refused_by_name_at_once(tmp_path):
    source = kind_shared_eval(tmp_path / "shared.eval", copies=64, member_mib=32)
    store = tmp_path / "s.duckdb"
    started = time.monotonic()
    code, _, err = peak_import(source, store)
    assert code == 1 and time.monotonic() - started < 20, err  # 255 MiB x 128: once 106 s
    refused = [line for line in err.splitlines() if "its data overlaps that of member" in line]
    assert len(refused) == 50 and "error: ... and 15 more" in err  # 65 entries, all named
    assert any("member samples/big_epoch_1.json: its data overlaps that of member "
               "samples/copy" in line for line in refused)
    assert _q(store, "SELECT count(*) FROM trajectories") == [(0,)]  # not one was inflated


def test_an_archive_inflating_far_beyond_its_size_stops_there_naming_it(tmp_path):
    padded = {f"s{i}_epoch_1": json.dumps(sample(f"s{i}")).encode()[:-1] + b" " * (12 << 20)
              + b"}" for i in range(16)}  # 16 x 12 MiB of JSON in a file of ~200 KB
    source = write_eval(tmp_path / "padded.eval", padded)
    store = tmp_path / "s.duckdb"
    code, peak, err = peak_import(source, store)
    assert code == 1, err
    assert (f"its members hold more than 134217728 bytes uncompressed in all (the limit: "
            f"{MAX_RATIO} times its {source.stat().st_size} bytes, 134217728 at least") in err
    assert "this sample and those after it are not read" in err
    # 10 whole samples fit in 128 MiB; the 11th fails, naming the limit; the rest are not read
    assert _q(store, "SELECT lines, imported, failed FROM imports") == [(11, 10, 1)]


def test_attachments_named_over_and_over_fail_their_sample(tmp_path):
    text = "x" * 3_000_000
    many = dict(sample("many"), attachments={"h": text},
                messages=[{"role": "user", "content": "q"}]
                + [{"role": "assistant", "content": "attachment://h"}] * 8)
    log = write_eval(tmp_path / "att.eval", {"a_epoch_1": sample("a"), "many_epoch_1": many,
                                             "few_epoch_1": dict(many, id="few",
                                                                 messages=many["messages"][:3])})
    report = ingest.import_file(log, tmp_path / "s.duckdb")
    assert (report.imported, report.failed) == (2, 1)
    assert report.errors == ["att.eval: sample many epoch 1: messages[6]: its attachments, as "
                             "its messages name them, hold more than 16777216 characters"]


def test_json_that_costs_more_to_parse_than_the_limit_is_refused_before_parsing(tmp_path):
    bomb = json.dumps(sample("bomb", metadata=[{}] * 9_000_000)).encode()  # 36 MB of {}s
    assert parse_cost(bomb) > 1 << 30
    log = write_eval(tmp_path / "costly.eval", {"bomb_epoch_1": bomb, "a_epoch_1": sample("a")})
    tracemalloc.start()
    report = ingest.import_file(log, tmp_path / "s.duckdb")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert (report.imported, report.failed) == (1, 1)
    assert "MiB to parse (more than the limit of 1024 MiB" in report.errors[0]
    assert peak < 200 << 20  # parsed, it would have taken ~900 MB


@pytest.mark.parametrize("unit", [b"{},", b"[],", b"1,", b"1.5e300,", b'"ab",', b'{"a":[]},',
                                  b'"\xf0\x9f\x98\x80",', b'{"k":"v","w":1},', b'"a\\u4e00",'])
def test_the_parse_estimate_is_never_below_what_parsing_takes(unit):
    data = b"[" + unit * 200_000 + unit.rstrip(b",") + b"]"
    tracemalloc.start()
    parsed = json.loads(data)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del parsed
    assert peak <= parse_cost(data) <= 5 * peak + (1 << 20), (peak, parse_cost(data))
    text = b'"' + b"word " * 2_000_000 + b'"'  # one long string: about twice its size
    assert parse_cost(text) < 3 * len(text)


# -- counts a line may hold ---------------------------------------------------------------------
def test_given_tokens_and_turns_over_their_limits_fail_by_count(tmp_path):
    base = {"task_id": "q", "reward": 1.0, "turns": [{"action": "a"}]}
    lines = [dict(base, traj_id="toks", tokens=[{"text": "a", "role": "action"}]
                  * (MAX_TRAJECTORY_TOKENS + 1)),
             dict(base, traj_id="turns", turns=[{"action": "a"}] * 10_001),
             dict(base, traj_id="ok")]
    source = tmp_path / "big.jsonl"
    source.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    report = ingest.import_file(source, tmp_path / "s.duckdb")
    assert report.imported == 1 and report.errors == [
        f"line 1: field 'tokens' holds {MAX_TRAJECTORY_TOKENS + 1} entries, over the limit of "
        f"{MAX_TRAJECTORY_TOKENS} per trajectory",
        "line 2: field 'turns' holds 10001 entries, over the limit of 10000 per trajectory"]


def test_what_a_record_keeps_is_bounded_by_its_count_of_values(tmp_path):
    """Past its parse, a record costs a few copies of every value it keeps: 2M empty objects
    in a sample's metadata (an 8 MB member in an 8 KB file) took 1.87 GB and 38 s at 8M; the
    count, not the bytes, is what bounds it. Events are only looked through, so they do not
    count; a score's values are each a reward component."""
    many = dict(sample("many"), metadata=[{}] * 2_000_001)
    events = dict(sample("events"), events=[{"event": "info"}] * 2_000_001)
    scores = dict(sample("scores"), scores={"match": {"value": [1] * 1_001}})
    log = write_eval(tmp_path / "values.eval", {"many_epoch_1": many, "events_epoch_1": events,
                                                "scores_epoch_1": scores})
    line = {"traj_id": "x", "task_id": "q", "reward": 1.0, "turns": [],
            "info": {"v": [0] * 2_000_001}}
    (tmp_path / "values.jsonl").write_text(json.dumps(line) + "\n", encoding="utf-8")
    report = ingest.import_file(log, tmp_path / "s.duckdb")
    assert report.imported == 1 and sorted(report.errors) == [
        "values.eval: sample many epoch 1: the sample holds more than 2000000 JSON values "
        "(objects, lists, numbers, strings), the limit for one trajectory",
        "values.eval: sample scores epoch 1: score 'match' holds 1001 values, over the limit "
        "of 1000 (each is a reward component)"]
    report = ingest.import_file(tmp_path / "values.jsonl", tmp_path / "s.duckdb")
    assert report.errors == ["line 1: the record holds more than 2000000 JSON values (objects, "
                             "lists, numbers, strings), the limit for one trajectory"]


def test_token_rows_cap_each_text_and_the_trajectory_and_keep_the_text_whole():
    def words(w, n):  # n whitespace pieces
        return " ".join([w] * n)

    long_action, prompt = words("a", MAX_TEXT_TOKENS + 10), words("p", 5)
    obs = [words("o", MAX_TEXT_TOKENS)] * 5  # 5 x 32,768 pieces: past the trajectory's 131,072
    rec = validate({"traj_id": "t", "task_id": "q", "reward": 1.0, "prompt": prompt,
                    "turns": [{"action": long_action, "observation": obs[0]}]
                    + [{"action": "x", "observation": o} for o in obs[1:]]})
    rows = ingest.to_rows(rec)
    tokens = rows["tokens"]
    made = list(tokens)
    assert len(made) == len(tokens)
    assert "".join(r["text"] for r in made) == prompt + long_action + "".join(
        ["x" * (i > 0) + o for i, o in enumerate(obs)])
    assert [r["pos"] for r in made] == list(range(len(made)))
    per_text = {}
    for r in made:
        per_text[(r["turn"], r["role"])] = per_text.get((r["turn"], r["role"]), 0) + 1
    assert per_text[(0, "action")] == MAX_TEXT_TOKENS  # its last row holds 11 pieces' text
    assert made[5 + MAX_TEXT_TOKENS - 1]["text"] == " a" * 11
    assert per_text[(0, "observation")] == per_text[(1, "observation")] == MAX_TEXT_TOKENS
    assert per_text[(2, "observation")] == MAX_TRAJECTORY_TOKENS - 5 - 3 * MAX_TEXT_TOKENS - 2
    assert per_text[(3, "observation")] == per_text[(4, "observation")] == 1  # past the cap
    info = json.loads(rows["trajectories"][0]["info"])
    assert [(c["turn"], c["role"]) for c in info["token_rows_cut"]] == [
        (0, "action"), (2, "observation"), (3, "observation"), (4, "observation")]
    assert rows["trajectories"][0]["response_tokens"] == tokens.trained() == MAX_TEXT_TOKENS + 4


def test_a_batch_is_full_at_its_records_token_rows_or_text():
    def rows(chars):
        return {"tokens": TokenRows.rebuilt("t", 0, [("w" * chars, "action", 0)], None)}
    size = BatchSize(3)
    size.add(rows(10))
    size.add(rows(10))
    assert not size.full()
    size.add(rows(10))
    assert size.full()
    size.clear()
    size.add(rows(MAX_BATCH_CHARS))
    assert size.full() and size.tokens == 1  # one row of 8 MiB: full by its text
