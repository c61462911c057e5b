"""The trajectory model (storage/trajectory.py) is the one place the schema is spelled: the
migrated store's tables, validation, the token columns' checks, the queries' column lists, the
recorder's JSON columns and export all follow it, and a turn's typed ``info`` replaces the OTLP
assembler's private per-turn key."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from storage import db, ingest, interchange, queries, recorder, token_columns, trajectory
from storage.export import export_jsonl
from storage.failures import FAILURE_CLASSES, RULES
from storage.ingest import door
from storage.interchange import LineError, validate
from storage.migrations import migrate
from storage.otlp.assemble import OpenTrace
from storage.otlp.decode import Span
from storage.otlp.record import build_record
from storage.protocol import TOOL_ACTIONS

SQL_TYPES = {"VARCHAR", "INTEGER", "DOUBLE", "BOOLEAN", "JSON"}


def _store_columns(con, table: str) -> dict[str, str]:
    return dict(con.execute("SELECT column_name, data_type FROM information_schema.columns "
                            "WHERE table_name = ? ORDER BY ordinal_position", [table]).fetchall())


def schema_drift(con, tables: dict) -> dict[str, set]:
    """{table: the (column, type) pairs the migrated store and the model do not share}."""
    drift = {}
    for table, spec in tables.items():
        model = {(f.name, f.sql) for f in spec if f.sql is not None}
        stored = set(_store_columns(con, table).items())
        if model != stored:
            drift[table] = model ^ stored
    return drift


def test_the_migrated_store_has_exactly_the_models_columns():
    con = db.connect(None)
    migrate(con)
    assert set(trajectory.TABLES) == {"trajectories", "turns", "tokens", "test_results",
                                      "rewards"}
    assert schema_drift(con, trajectory.TABLES) == {}
    assert {f.sql for spec in trajectory.TABLES.values() for f in spec} - {None} <= SQL_TYPES


def test_a_field_added_to_the_model_without_a_migration_is_caught():
    con = db.connect(None)
    migrate(con)
    grown = dict(trajectory.TABLES, turns=trajectory.TURN + (
        trajectory.Field("mood", "str", False, "VARCHAR", "how the agent felt"),))
    assert schema_drift(con, grown) == {"turns": {("mood", "VARCHAR")}}
    con.execute("ALTER TABLE tokens ADD COLUMN surprise DOUBLE")  # a migration the model lacks
    assert schema_drift(con, trajectory.TABLES) == {"tokens": {("surprise", "DOUBLE")}}


def test_every_place_that_spelled_the_schema_reads_the_model():
    fields = trajectory.record_fields
    assert interchange.TOP_FIELDS == fields(trajectory.TRAJECTORY)
    assert interchange.TURN_FIELDS == fields(trajectory.TURN)
    assert interchange.TOKEN_FIELDS == fields(trajectory.TOKEN)
    assert interchange.TEST_FIELDS == fields(trajectory.TEST)
    assert list(interchange.TOP_FIELDS)[:4] == ["traj_id", "task_id", "turns", "reward"]
    assert interchange.ROLES == token_columns.ROLES == trajectory.ROLES
    # every log-probability the model has is checked as one in columns too (not only two)
    assert set(token_columns.LOGPROBS) == {"logprob", "train_logprob", "new_logprob",
                                           "ref_logprob"}
    order = list(interchange.TOKEN_FIELDS)
    assert [order.index(n) for n in token_columns.VALUE_ORDER] == \
        sorted(order.index(n) for n in token_columns.VALUE_ORDER)
    assert recorder.JSON_COLUMNS == {"trajectories": ("golds", "info"),
                                     "turns": ("parsed", "state_diff", "info")}
    assert queries.TURN_COLUMNS == [c for c in trajectory.columns("turns")
                                    if c not in ("run_id", "step")]
    assert set(queries.TRAJ_COLUMNS.split(", ")) == \
        set(trajectory.columns("trajectories")) - {"run_id", "rank"}
    assert set(queries.TOKEN_COLUMNS) == set(trajectory.columns("tokens")) - {
        "run_id", "step", "traj_id"}
    assert [n for n, _ in RULES] == list(FAILURE_CLASSES) == list(trajectory.FAILURE_CLASSES)
    assert TOOL_ACTIONS == {a.name for a in trajectory.ACTION_TYPES.values() if a.tool}
    with pytest.raises(KeyError, match="mood"):
        trajectory.select("turns", "action", "mood")


def test_columns_and_objects_refuse_the_same_positive_ref_logprob():
    tok = {"text": "a", "role": "action", "ref_logprob": 0.5}
    with pytest.raises(LineError) as by_object:
        validate({"traj_id": "t", "task_id": "q", "reward": 1.0, "turns": [], "tokens": [tok]})
    cols = token_columns.TokenColumns(pa.array(["a"]), np.array([1], np.int8),
                                      np.array([0], np.int32))
    cols.set_values("ref_logprob", [0.5], np.array([True]))
    by_columns = cols.check(10, interchange.LOGPROB_SLACK)
    assert by_columns == str(by_object.value)
    assert "tokens[0].ref_logprob' must be a log-probability" in by_columns


def _record(**turn_extra):
    return {"traj_id": "t1", "task_id": "q1", "reward": 1.0, "success": True,
            "turns": [{"action": "<answer>4</answer>", "observation": "", "action_type": "answer",
                       "state_key": "s0", "info": {"model": "m", "input_tokens": 12},
                       **turn_extra}]}


def test_a_turns_info_and_state_key_are_stored_and_round_trip_through_export(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(_record()) + "\n")
    ingest.import_file(src, tmp_path / "a.duckdb", run_id="a")
    turn = queries.turns(tmp_path / "a.duckdb", "a", ["t1"]).iloc[0]
    assert json.loads(turn["info"]) == {"model": "m", "input_tokens": 12}
    assert turn["state_key"] == "s0"
    out = tmp_path / "out.jsonl"
    export_jsonl(tmp_path / "a.duckdb", "a", out)
    exported = json.loads(out.read_text().splitlines()[-1])
    assert exported["turns"][0]["info"] == {"model": "m", "input_tokens": 12}  # an object
    ingest.import_file(out, tmp_path / "b.duckdb", run_id="b")
    again = queries.turns(tmp_path / "b.duckdb", "b", ["t1"]).iloc[0]
    assert json.loads(again["info"]) == {"model": "m", "input_tokens": 12}


def test_a_turn_info_that_is_not_an_object_fails_its_line_named():
    with pytest.raises(LineError, match=r"turns\[0\]\.info' must be an object, got list"):
        validate(_record(info=[1, 2]))


def _span(span_id: str, start: int, **attributes) -> Span:
    return Span("ab" * 16, span_id, "", "chat", 3, start, start + 10**9, attributes,
                {"service.name": "agent"}, "scope")


def test_the_otlp_assembly_gives_typed_turn_info_and_no_private_keys():
    spans = [_span("01" * 8, 1, **{"gen_ai.operation.name": "chat",
                                   "gen_ai.request.model": "m1", "gen_ai.usage.input_tokens": 7,
                                   "gen_ai.output.messages": json.dumps(
                                       [{"role": "assistant", "parts": [
                                           {"type": "text", "content": "hi"}]}])})]
    rec = build_record(OpenTrace("k", "r", "t", spans={s.span_id: s for s in spans}), True)
    assert not [k for k in rec if k.startswith("_")]
    assert set(rec) <= set(interchange.TOP_FIELDS)
    info = rec["turns"][0]["info"]
    assert (info["span_id"], info["model"], info["input_tokens"]) == ("01" * 8, "m1", 7)
    rows = interchange.to_rows(validate(rec))
    assert json.loads(rows["turns"][0]["info"])["model"] == "m1"
    given = build_record(OpenTrace("k", "r", "t", spans={s.span_id: s for s in spans}), True,
                         given={"reward": 0.5, "success": None, "source": "scores file s"})
    assert (given["reward"], given["success"]) == (0.5, False)
    assert given["info"]["import_notes"] == ["success inferred as reward >= 1"]
    assert given["info"]["otel"]["reward_source"] == "scores file s"


def test_typed_records_come_from_a_validated_record_and_give_the_stores_rows():
    rec = validate(dict(_record(), tests=[{"name": "ok", "passed": True}],
                        tokens=[{"text": "4", "role": "action", "logprob": -0.1}]))
    traj = trajectory.from_record(rec)
    assert isinstance(traj, trajectory.Trajectory) and traj.num_turns == 1
    turn = traj.turns[0]
    assert (turn.turn, turn.state_key, turn.info["model"]) == (0, "s0", "m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        turn.action = "x"
    assert set(trajectory.row(turn)) == set(trajectory.columns("turns"))
    assert set(trajectory.row(traj)) == set(trajectory.columns("trajectories"))
    assert trajectory.row(traj.tokens[0])["logprob"] == -0.1
    assert trajectory.row(traj.tests[0])["passed"] is True
    assert [(r.component, r.value) for r in traj.rewards] == []


@pytest.mark.parametrize("value, message", [
    (True, "field 'x' must be a number, got bool"),
    (None, "field 'x' must be a number, got null"),
    (10**400, "field 'x' must be a number a double can hold, got an integer of 1329 bits"),
    (float("inf"), "field 'x' must be a finite number, got inf"),
])
def test_one_number_check_for_the_doors_and_the_generic_record(value, message):
    assert door.number is interchange.number
    with pytest.raises(LineError) as err:
        door.number(value, "x")
    assert str(err.value) == message
    if value is not None:
        with pytest.raises(LineError, match="field 'reward' must be a"):
            validate({"traj_id": "t", "task_id": "q", "reward": value, "turns": []})


def test_both_writers_rows_name_only_the_models_columns():
    """The trainer's rows (core/run/step_rows.py) and an import's (interchange ``to_rows``):
    a column either writes that the model lacks would be a second spelling of the schema."""
    from core.envs.base import Task
    from core.rollout.trajectory import Trajectory, Turn
    from core.run.step_rows import step_tables

    traj = Trajectory("t1", "g1", Task("q1", "2+2?"), turns=[
        Turn(0, "<answer>4</answer>", "", True, "answer", state_key="s0", info={"k": 1})],
        token_ids=[1, 2], token_text=["2+2?", "4"], roles=["prompt", "action"],
        trained=[False, True], logprobs=[None, -0.1], token_turn=[-1, 0],
        rewards={"outcome": 1.0}, reward=1.0)
    imported = interchange.to_rows(validate(dict(_record(), tests=[{"name": "a", "passed": True}])))
    for table, rows in step_tables([traj]).items():
        if table in trajectory.TABLES:
            assert set(rows) <= set(trajectory.columns(table)), table
    for table in ("trajectories", "rewards", "turns", "test_results"):
        assert set().union(*imported[table]) <= set(trajectory.columns(table)), table
    assert set(imported["trajectories"][0]) == set(trajectory.columns("trajectories")) - {
        "run_id"}


def test_a_store_older_than_a_token_column_reads_it_as_null(tmp_path, monkeypatch):
    from storage import migrations
    path = tmp_path / "old.duckdb"
    monkeypatch.setattr(migrations, "MIGRATIONS", migrations.MIGRATIONS[:5])  # before schema 6
    with db.writing(path) as con:
        migrations.migrate(con)
        con.execute("INSERT INTO tokens (run_id, step, traj_id, pos, text, role, trained, logprob) "
                    "VALUES ('r', 0, 't', 0, 'a', 'action', TRUE, -0.5)")
    monkeypatch.undo()
    df = queries.tokens(path, "r", "t")
    assert list(df.columns) == list(queries.TOKEN_COLUMNS)
    row = df.iloc[0]
    assert row["logprob"] == -0.5
    assert pd.isna(row["train_logprob"]) and pd.isna(row["rejected"])
