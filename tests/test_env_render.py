"""An environment's own pictures of its state (the optional ``Episode.render()``): checked and
capped (core/envs/render.py), drawn after reset and after every step by the rollout, recorded per
turn in ``renders`` (migration m007) and read back for Replay; a render that raises, returns
something unusable or too big leaves a note and never ends the episode."""
from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import duckdb
import pytest

from core.envs import render as render_mod
from core.envs.base import Outcome, StepResult, Task
from core.envs.render import Picture, checked_render
from core.rollout.engine import rollout
from core.rollout.sampling import Sampling
from core.run.step_rows import step_tables
from storage import queries
from storage.migrations import SCHEMA_VERSION, prepare
from storage.recorder import Recorder
from storage.turn_queries import RENDER_READ_CAP

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.usefixtures("one_torch_thread")
SVG = '<svg xmlns="http://www.w3.org/2000/svg" width="4" height="4"><rect width="4" height="4"/></svg>'
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 16


# -- the check, by hand ----------------------------------------------------------------------------
def test_svg_png_and_tables_are_kept_and_anything_else_is_a_reason():
    assert checked_render(None) is None
    assert checked_render(SVG) == Picture("svg", SVG)
    prolog = '<?xml version="1.0"?>\n<!-- drawn -->\n' + SVG
    assert checked_render(prolog) == Picture("svg", prolog)
    assert checked_render(PNG) == Picture("png", base64.b64encode(PNG).decode())
    table = checked_render([{"cell": "a1", "n": 2, "x": float("nan"), "obj": object}])
    assert table.kind == "table" and json.loads(table.body)[0]["x"] == "nan"
    assert "does not start with <svg>" in checked_render("<div>hello</div>")
    assert "not a PNG" in checked_render(b"GIF89a....")
    assert "expected SVG text" in checked_render({"svg": SVG})
    assert "rows are not dicts" in checked_render(["a", "b"])
    assert "at most 200 are kept" in checked_render([{"i": i} for i in range(201)])
    assert "at most 20" in checked_render([{str(i): i for i in range(21)}])


def test_a_picture_over_the_cap_is_refused_naming_its_size():
    big = SVG[:-6] + "<!--" + "x" * render_mod.MAX_BYTES + "--></svg>"
    why = checked_render(big)
    assert isinstance(why, str) and "the cap is 200,000" in why and "of svg" in why
    assert "of png" in checked_render(PNG + b"\x00" * render_mod.MAX_BYTES)
    cell = checked_render([{"t": "y" * 10_000}])                  # cells are cut, not refused
    assert len(json.loads(cell.body)[0]["t"]) == render_mod.MAX_CELL_CHARS


# -- through the rollout ---------------------------------------------------------------------------
class Episode:
    def __init__(self, task, mode):
        self.task, self.mode, self.turns = task, mode, 0

    def reset(self):
        return "Say anything."

    def step(self, action_text):
        self.turns += 1
        return StepResult(f"turn {self.turns} done", done=False, valid=True)

    def outcome(self):
        return Outcome(score=1.0, success=True)

    def render(self):
        if self.mode == "raises":
            raise RuntimeError("the renderer lost its font")
        if self.mode == "too_big":
            return "<svg>" + "x" * (render_mod.MAX_BYTES + 1) + "</svg>"
        if self.mode == "html":
            return "<script>alert(1)</script>"
        if self.mode == "table":
            return [{"turn": self.turns}]
        return SVG.replace('width="4"', f'width="{4 + self.turns}"', 1)


class Env:
    name, stop_tags, system_prompt = "painter", ("</a>",), ""
    modes = ["svg", "raises", "too_big", "html", "table"]

    def tasks(self, split, n, seed):
        return [Task(task_id=f"t{i}", prompt="Say anything.") for i in range(n)]

    def episode(self, task, seed):
        return Episode(task, self.modes[seed % len(self.modes)])


@pytest.fixture(scope="module")
def trajs():
    from core.model.policy import load_policy
    pol = load_policy("tiny", seed=0)
    env = Env()
    return rollout(pol, env, env.tasks("train", 1, 0), group_size=5, seed=0,
                   sampling=Sampling(max_turns=2, max_new_tokens=3, max_context=512,
                                     max_obs_tokens=16))


def _by_mode(trajs):
    return {Env.modes[t.info["episode_seed"] % 5]: t for t in trajs}


def test_every_state_is_drawn_and_a_failing_render_is_a_note_not_an_error(trajs):
    by = _by_mode(trajs)
    assert all(t.finish_reason == "max_turns" and t.num_turns == 2 for t in trajs)
    assert [r["turn"] for r in by["svg"].renders] == [-1, 0, 1]   # after reset, after each turn
    assert 'width="6"' in by["svg"].renders[-1]["body"]
    assert [json.loads(r["body"]) for r in by["table"].renders] == [
        [{"turn": 0}], [{"turn": 1}], [{"turn": 2}]]
    for mode, said in (("raises", "RuntimeError: the renderer lost its font"),
                       ("too_big", "the cap is 200,000"), ("html", "does not start with <svg>")):
        t = by[mode]
        assert t.renders == [] and t.info["render_failures"] == 3, mode
        assert [n["turn"] for n in t.info["render_notes"]] == [-1, 0, 1]
        assert all(said in n["note"] for n in t.info["render_notes"]), mode
        assert "env_error" not in t.info and t.outcome.success


def test_pictures_are_recorded_per_turn_and_read_back(trajs, tmp_path):
    path = tmp_path / "s.duckdb"
    rec = Recorder(path)
    run = rec.start_run({"env": "painter", "model": "tiny", "algo": "grpo"})
    rec.record_step(1, metrics={"reward/mean": 1.0}, **step_tables(trajs))
    rec.finish()
    by = _by_mode(trajs)
    got = queries.renders(str(path), run, by["svg"].traj_id)
    assert got["turn"].tolist() == [-1, 0, 1] and set(got["kind"]) == {"svg"}
    assert got["body"].tolist() == [r["body"] for r in by["svg"].renders]
    assert queries.renders(str(path), run, by["raises"].traj_id).empty
    notes = queries.trajectory(str(path), run, by["raises"].traj_id)["info"]
    assert json.loads(notes)["render_failures"] == 3


def test_a_body_too_big_to_read_back_comes_as_null_with_its_size(tmp_path):
    path = tmp_path / "s.duckdb"
    rec = Recorder(path)
    run = rec.start_run({"env": "painter"})
    body = "x" * RENDER_READ_CAP
    rec.record_step(0, renders=[{"traj_id": "a", "turn": 0, "kind": "svg", "body": body + "yz"}])
    rec.finish()
    got = queries.renders(str(path), run, "a").iloc[0]
    assert got["body"] is None and int(got["size"]) == len(body) + 2


# -- the migration ---------------------------------------------------------------------------------
def test_an_old_store_reads_without_pictures_and_migrates_to_record_them(tmp_path):
    old = tmp_path / "old.duckdb"
    shutil.copy(ROOT / "sample_runs" / "spike_frozenlake.duckdb", old)   # schema 2
    run, traj = duckdb.connect(str(old), read_only=True).execute(
        "SELECT run_id, traj_id FROM trajectories LIMIT 1").fetchone()
    assert queries.renders(str(old), run, traj).empty                      # read as it is
    applied = prepare(old)
    assert "m007_renders" in applied and len(applied) == SCHEMA_VERSION - 2  # from schema 2
    with duckdb.connect(str(old), read_only=True) as con:
        cols = [r[0] for r in con.execute("SELECT column_name FROM information_schema.columns "
                                          "WHERE table_name = 'renders' ORDER BY ordinal_position")
                .fetchall()]
        kept = con.execute("SELECT count(*) FROM turns").fetchone()[0]
    assert cols == ["run_id", "step", "traj_id", "turn", "kind", "body"] and kept > 0
    assert queries.renders(str(old), run, traj).empty
    assert prepare(old) == []                                              # applied once


def test_only_a_guarded_episode_is_asked_for_its_picture():
    from core.envs.guard import Guard
    from core.rollout.episode import record_render
    from core.rollout.trajectory import Trajectory
    env, task = Env(), Task(task_id="t", prompt="p")
    traj = Trajectory("a", "g", task)
    record_render(traj, Episode(task, "raises"), 0)          # unguarded (a branch's replay)
    assert traj.renders == [] and "render_notes" not in traj.info
    with Guard(env) as guard:
        record_render(traj, guard.open(task, 0), -1)         # seed 0: svg
    assert [r["kind"] for r in traj.renders] == ["svg"]


def test_sft_demonstrations_are_drawn_like_rollouts():
    """The scripted expert's episodes (SFT's demonstrations) keep their pictures too: the guess
    example's interval after reset and after every guess, written with the step's tables."""
    from core.model.policy import load_policy
    from core.rollout.sft import demonstrations
    from examples.guess import Factory
    env = Factory(high=16)
    pol = load_policy("tiny", seed=0)
    demos = demonstrations(env, env.tasks("train", 2, 0), pol.tokenizer,
                           Sampling(max_turns=6, max_context=512), seed=0, id_prefix="s0")
    assert demos and all(d.outcome.success for d in demos)
    for d in demos:
        assert [r["turn"] for r in d.renders] == list(range(-1, len(d.turns)))
        assert {r["kind"] for r in d.renders} == {"table"}
        first, last = json.loads(d.renders[0]["body"])[0], json.loads(d.renders[-1]["body"])[0]
        assert (first["secret is at least"], first["secret is at most"]) == (1, 16)
        assert last["secret is at least"] == last["secret is at most"]   # found
    rows = step_tables(demos)["renders"]
    assert len(rows["traj_id"]) == sum(len(d.turns) + 1 for d in demos)
