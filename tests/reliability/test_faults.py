"""Faults inside a step of the real trainer: tools that raise or return garbage, and non-finite
losses and gradients. Each is recorded with its reason; the step and the run go on, or the run
stops with a clear message after ``max_bad_steps``."""
import pytest

from .helpers import BANDIT, SEARCH, assert_whole, finish, q, trainer


def test_tool_errors_and_garbage_become_error_turns_and_the_step_goes_on(tmp_path):
    db = tmp_path / "store.duckdb"
    code, err = finish(trainer([*SEARCH, "--group-size", "4", "--steps", "1", "--eval-every", "0",
                                "--db", str(db)], fault="env-faults"))
    assert code == 0, err[-2000:]
    [(run_id, status)] = q(db, "SELECT run_id, status FROM runs")
    assert status == "finished"
    rows = q(db, """SELECT split_part(t.traj_id, '-r', 2)::INT AS r, t.finish_reason, u.error,
                           u.action_valid, u.observation
                    FROM trajectories t JOIN turns u USING (run_id, traj_id)
                    WHERE u.turn = 0 ORDER BY t.traj_id""")
    assert len(rows) == 8                                   # 2 tasks x 4 rollouts, all recorded
    by_r = {}
    for r, reason, error, valid, obs in rows:
        by_r.setdefault(r, []).append((reason, error, valid, obs))
    for reason, error, valid, obs in by_r[0]:
        assert (reason, valid, obs) == ("env_error", False, "")
        assert error == "RuntimeError: tool crashed: connection reset"
    for reason, error, valid, obs in by_r[1]:
        assert reason == "env_error" and error == "step returned dict, not a StepResult"
    for reason, error, valid, obs in by_r[2]:
        assert reason == "env_error" and "surrogate" in error
    for reason, error, valid, obs in by_r[3]:                # the healthy rollouts went on
        assert reason != "env_error" and "crashed" not in (error or "")
    assert_whole(db, run_id)
    # a failed tool still gets its four reward rows and format credit 0 (no valid action)
    assert q(db, """SELECT DISTINCT r.value FROM rewards r JOIN trajectories t
                    USING (run_id, traj_id) WHERE t.finish_reason = 'env_error'
                    AND r.component = 'format'""") == [(0.0,)]


@pytest.mark.parametrize("fault, reason", [("nan-loss@2", "non-finite loss on s"),
                                           ("nan-grad@2", "non-finite gradient norm nan")])
def test_non_finite_updates_are_skipped_recorded_and_stop_the_run(tmp_path, fault, reason):
    db = tmp_path / "store.duckdb"
    code, err = finish(trainer([*BANDIT, "--steps", "4", "--eval-every", "0", "--max-bad-steps",
                                "2", "--db", str(db)], fault=fault))
    assert code == 1
    assert "2 consecutive updates skipped (max_bad_steps)" in err and reason in err
    [(run_id, status, error, last)] = q(db, "SELECT run_id, status, error, last_step FROM runs")
    assert status == "failed" and last == 3            # the last bad step was recorded first
    assert "max_bad_steps" in error and "step 3: update skipped" in error and reason in error
    skipped = dict(q(db, "SELECT step, value FROM metrics WHERE name = 'update/skipped' "
                         "ORDER BY 1"))
    assert skipped == {1: 0.0, 2: 1.0, 3: 1.0}
    flag = "update/nonfinite_loss" if "loss" in fault else "update/nonfinite_grad"
    assert [s for (s,) in q(db, "SELECT step FROM metrics WHERE name = ? ORDER BY 1", [flag])] \
        == [2, 3]
    assert q(db, "SELECT count(*) FROM metrics WHERE name = 'update/steps' AND value > 0") \
        == [(1,)]                                      # only step 1 moved the weights
    assert_whole(db, run_id)
