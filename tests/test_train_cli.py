"""``python -m core.train`` end to end with the tiny model: every table written with consistent
counts, configuration errors named, Ctrl-C stops cleanly, and resume continues without losing or
duplicating a step (also after a hard kill)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from core.config import TrainConfig
from core.commands.train import build_parser, main, resolve_config
from storage import queries
from storage.behaviours import run_job

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--env", "search", "--model", "tiny", "--group-size", "2", "--tasks-per-step", "2",
         "--max-turns", "2", "--max-new-tokens", "12", "--seed", "0", "--threads", "1", "--quiet"]
CONTRACT_METRICS = {"reward/mean", "reward/std", "reward/group_std_mean", "reward/frac_zero_std",
                    "success/rate", "grad/norm", "policy/entropy", "policy/kl", "policy/clipfrac",
                    "response/length_mean", "env/turns_mean", "time/step_s"}


def _cli(args, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "core.train", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _run(args, timeout=240):
    proc = _cli(args)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return out


def _q(db, sql, params=()):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, list(params)).fetchall()
    finally:
        con.close()


def test_two_step_run_writes_every_table_consistently(tmp_path):
    db = tmp_path / "store.duckdb"
    _run(SMALL + ["--algo", "grpo", "--steps", "2", "--sft-steps", "1", "--sft-batch-size", "2",
                  "--eval-every", "1", "--eval-tasks", "2", "--db", str(db), "--name", "cli"])
    [(run_id, name, status, env, model, algo)] = _q(db, """
        SELECT run_id, name, status, config->>'env', config->>'model', config->>'algo' FROM runs""")
    assert (name, status, env, model, algo) == ("cli", "finished", "search", "tiny", "grpo")
    # steps: SFT step 1 (+ eval after SFT carrying step 1), RL steps 2 and 3 (+ eval each)
    assert _q(db, "SELECT step, split, count(*) FROM trajectories GROUP BY ALL ORDER BY ALL") == [
        (1, "eval", 2), (1, "sft", 2), (2, "eval", 2), (2, "train", 4), (3, "eval", 2), (3, "train", 4)]
    assert _q(db, "SELECT count(*) = count(DISTINCT traj_id) FROM trajectories") == [(True,)]
    names = {step: {n for (n,) in _q(db, "SELECT name FROM metrics WHERE step = ?", [step])}
             for step in (1, 2, 3)}
    assert {"sft/loss", "sft/grad_norm", "eval/success", "time/step_s"} <= names[1]
    for step in (2, 3):
        assert CONTRACT_METRICS | {"eval/success", "time/rollout_s", "time/reward_s", "time/update_s",
                                   "time/record_s", "perf/tokens_per_s", "success/pass@G",
                                   "collapse/repeat_frac", "env/valid_action_ratio",
                                   "policy/clipfrac_low", "policy/clipfrac_high",
                                   "policy/ratio_min", "policy/ratio_max"} <= names[step]
    assert _q(db, "SELECT count(*) FROM (SELECT step, name FROM metrics GROUP BY ALL "
                  "HAVING count(*) > 1)") == [(0,)]
    # tokens: one row per context position; trained == model tokens of trained splits;
    # logprob wherever the model sampled
    bad = _q(db, """
        SELECT t.traj_id FROM trajectories t JOIN tokens k USING (run_id, traj_id)
        GROUP BY t.traj_id, t.split, t.response_tokens
        HAVING count(*) <> max(k.pos) + 1 OR count(DISTINCT k.pos) <> count(*)
            OR sum((k.role = 'action')::INT) <> t.response_tokens
            OR bool_or(k.trained <> (k.role = 'action' AND t.split <> 'eval'))
            OR bool_or(t.split <> 'sft' AND (k.logprob IS NOT NULL) <> (k.role = 'action'))
            OR bool_or(t.split = 'train' AND k.trained AND k.advantage IS NULL)
            OR bool_or(t.split = 'train' AND k.trained AND k.ref_logprob IS NULL)""")
    assert bad == []
    # the token texts of each turn spell exactly its action and observation
    turns = _q(db, "SELECT traj_id, turn, action, observation FROM turns")
    texts = {}
    for traj_id, turn, role, text in _q(db, "SELECT traj_id, turn, role, string_agg(text, '' "
                                            "ORDER BY pos) FROM tokens GROUP BY ALL"):
        texts[(traj_id, turn, role)] = text
    for traj_id, turn, action, observation in turns:
        assert texts.get((traj_id, turn, "action"), "").removesuffix("<|im_end|>") == action
        assert texts.get((traj_id, turn, "observation"), "") == observation
    assert _q(db, "SELECT count(*) FROM trajectories t WHERE num_turns <> (SELECT count(*) FROM "
                  "turns u WHERE u.traj_id = t.traj_id)") == [(0,)]
    # the four reward components for every trajectory; training rollouts on search (gold
    # answers) also carry their measured information gain (core/credit/info_gain.py)
    assert _q(db, "SELECT DISTINCT t.split = 'train', count(r.component) AS n FROM "
                  "trajectories t LEFT JOIN rewards r USING (run_id, traj_id) "
                  "WHERE r.component IN ('cost', 'format', 'outcome', 'process') "
                  "GROUP BY t.traj_id, t.split HAVING n <> 4") == []
    assert _q(db, "SELECT DISTINCT component FROM rewards ORDER BY 1") == [
        ("cost",), ("format",), ("info_gain",), ("outcome",), ("process",)]
    assert _q(db, "SELECT DISTINCT t.split FROM trajectories t JOIN rewards r USING "
                  "(run_id, traj_id) WHERE r.component = 'info_gain'") == [("train",)]
    # per LoRA module gradient norms, every SFT and RL step; per trajectory norms on train rows
    assert _q(db, "SELECT step, count(*) FROM grad_stats GROUP BY 1 ORDER BY 1") == [
        (1, 14), (2, 14), (3, 14)]
    assert _q(db, "SELECT count(*) FROM trajectories WHERE split IN ('train', 'sft') "
                  "AND grad_norm IS NULL") == [(0,)]
    # behaviours (storage/behaviours/) at each RL step, the same as ``agentrl behaviours``
    # computes afterwards from the store
    paid = "SELECT step, name, value FROM metrics WHERE starts_with(name, 'behaviour/') ORDER BY ALL"
    recorded = _q(db, paid)
    assert {s for s, n, _ in recorded if n == "behaviour/turns/rate"} == {2, 3}
    run_job(db, run_id)
    rounded = lambda rows: [(s, n, round(v, 9)) for s, n, v in rows]  # noqa: E731
    assert rounded(_q(db, paid)) == rounded(recorded)


def test_configuration_errors_exit_2_naming_the_field(tmp_path, capsys):
    db = str(tmp_path / "x.duckdb")
    assert main(["--algo", "grpo", "--group-size", "1", "--db", db]) == 2
    assert "group_size" in capsys.readouterr().err
    assert main(["--lr", "5", "--db", db]) == 2
    assert "lr" in capsys.readouterr().err
    assert main(["--env", "chess", "--db", db]) == 2
    assert "env" in capsys.readouterr().err
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("steps: 2\nlearning_rate: 0.1\n")
    assert main(["--config", str(bad_yaml), "--db", db]) == 2
    assert "learning_rate" in capsys.readouterr().err
    assert main(["--resume", "nope", "--db", db]) == 2
    assert "resume" in capsys.readouterr().err
    assert not Path(db).exists()  # nothing was started
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "many"])
    assert exc.value.code == 2


def test_flags_override_yaml_which_overrides_preset_and_algo_defaults(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump({"steps": 7, "lr": 0.001, "group_size": 3}))
    parse = build_parser().parse_args
    cfg = resolve_config(parse(["--preset", "tiny-smoke", "--config", str(cfg_file), "--steps", "4"]))
    assert (cfg.steps, cfg.lr, cfg.group_size) == (4, 0.001, 3)
    assert cfg.max_new_tokens == 16  # from the preset, untouched by the YAML file
    star = resolve_config(parse(["--algo", "starpo_s"]))
    assert (star.clip_eps_high, star.kl_coef) == (0.28, 0.0)
    assert resolve_config(parse(["--algo", "starpo_s", "--kl-coef", "0.01"])).kl_coef == 0.01
    assert resolve_config(parse([])) == TrainConfig()


def _wait_for_step(db, run_min_step, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-2000:]
        if db.exists():
            try:
                runs = queries.runs(db)
                if not runs.empty and (runs["last_step"].fillna(-1) >= run_min_step).any():
                    return runs.iloc[0]["run_id"]
            except Exception:  # the trainer holds the file for a moment: try again
                pass
        time.sleep(0.2)
    raise AssertionError("the trainer did not reach the step in time")


def _assert_complete(db, run_id, steps, per_step=4):
    rows = _q(db, "SELECT step, count(*), count(DISTINCT traj_id) FROM trajectories "
                  "WHERE run_id = ? AND split = 'train' GROUP BY 1 ORDER BY 1", [run_id])
    assert rows == [(s, per_step, per_step) for s in range(1, steps + 1)]
    assert _q(db, "SELECT count(*) - count(DISTINCT traj_id) FROM trajectories WHERE run_id = ?",
              [run_id]) == [(0,)]
    assert _q(db, "SELECT count(*) FROM (SELECT step, name FROM metrics WHERE run_id = ? "
                  "GROUP BY ALL HAVING count(*) > 1)", [run_id]) == [(0,)]
    assert _q(db, "SELECT count(*) - count(DISTINCT (traj_id, pos)) FROM tokens WHERE run_id = ?",
              [run_id]) == [(0,)]
    assert _q(db, "SELECT status FROM runs WHERE run_id = ?", [run_id]) == [("finished",)]


def test_ctrl_c_stops_after_the_step_and_resume_continues(tmp_path):
    db = tmp_path / "store.duckdb"
    proc = _cli(SMALL + ["--steps", "5", "--eval-every", "0", "--db", str(db)])
    run_id = _wait_for_step(db, 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    [(status, last)] = _q(db, "SELECT status, last_step FROM runs")
    assert status == "stopped" and 1 <= last < 5
    assert (tmp_path / "checkpoints" / run_id / "checkpoint.pt").is_file()
    _run(["--resume", run_id, "--db", str(db), "--quiet"])
    _assert_complete(db, run_id, 5)


def test_hard_kill_resumes_from_the_last_checkpoint_without_duplicates(tmp_path):
    db = tmp_path / "store.duckdb"
    proc = _cli(SMALL + ["--steps", "5", "--eval-every", "0", "--checkpoint-every", "2",
                         "--db", str(db)])
    run_id = _wait_for_step(db, 3, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert _q(db, "SELECT status FROM runs") == [("running",)]
    _run(["--resume", run_id, "--db", str(db), "--quiet"])
    _assert_complete(db, run_id, 5)


def test_a_crash_marks_the_run_failed_with_the_error(tmp_path, capsys):
    db = tmp_path / "store.duckdb"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should go")
    # adapter snapshots off: the step-0 snapshot would hit the blocked directory before step 1
    rc = main(SMALL + ["--steps", "1", "--eval-every", "0", "--db", str(db),
                       "--checkpoint-dir", str(blocker), "--adapter-every", "0"])
    assert rc == 1
    assert "training failed" in capsys.readouterr().err
    [(status, error, last)] = _q(db, "SELECT status, error, last_step FROM runs")
    assert status == "failed" and "not-a-dir" in error
    assert last == 1  # the step itself was recorded before the checkpoint failed


def test_a_blocked_adapter_snapshot_fails_the_run_before_training(tmp_path, capsys):
    """With snapshots on, the policy before step 1 is kept first: an unusable checkpoint
    directory fails the run at once, named, with no step recorded."""
    db = tmp_path / "store.duckdb"
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the checkpoint directory should go")
    rc = main(SMALL + ["--steps", "1", "--eval-every", "0", "--db", str(db),
                       "--checkpoint-dir", str(blocker), "--adapter-every", "1"])
    assert rc == 1
    assert "training failed" in capsys.readouterr().err
    [(status, error, last)] = _q(db, "SELECT status, error, last_step FROM runs")
    assert status == "failed" and "not-a-dir" in error and last is None
