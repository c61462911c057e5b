"""``python -m core.train`` with one fault injected at a precise point, for the reliability tests.

    AGENTRL_FAULT=hold-write@3 AGENTRL_FAULT_MARK=/tmp/m python -m tests.reliability.faulty_train ...

The real trainer runs unchanged; this wrapper only replaces one function before it starts:

* ``hold-write@N``   inside step N's database transaction (rows inserted, not committed): touch
                     the mark file and sleep, so a test can kill -9 the process mid-write;
* ``hold-rollout@N`` at the start of RL step N's rollout: touch the mark file and sleep;
* ``nan-loss@N``     from RL step N on, every policy loss is NaN;
* ``nan-grad@N``     from RL step N on, the loss stays finite but its gradient is NaN;
* ``env-faults``     of each task group, rollout 0's tool raises, rollout 1's returns garbage
                     (not a StepResult), rollout 2's returns text with a lone surrogate.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

HOLD_S = 600


def _hold() -> None:
    Path(os.environ["AGENTRL_FAULT_MARK"]).touch()
    time.sleep(HOLD_S)


def _install(kind: str, step: int) -> None:
    import core.run.steps as trainer  # where a step calls rollout and policy_update
    import storage.recorder as recorder
    if kind == "hold-write":
        insert = recorder.insert_frame

        def held_insert(con, table, frame, run_id, at_step):
            insert(con, table, frame, run_id, at_step)
            if at_step == step and table == "metrics":
                _hold()
        recorder.insert_frame = held_insert
    elif kind == "hold-rollout":
        rollout = trainer.rollout

        def held_rollout(*args, **kwargs):
            if kwargs.get("id_prefix") == f"s{step}":
                _hold()
            return rollout(*args, **kwargs)
        trainer.rollout = held_rollout
    elif kind in ("nan-loss", "nan-grad"):
        import torch
        import core.learn.update as update
        loss_fn, calls = update.policy_loss, {"n": 0}
        update_fn = trainer.policy_update

        def counted_update(*args, **kwargs):
            calls["n"] += 1
            return update_fn(*args, **kwargs)

        def bad_loss(logprobs, *args, **kwargs):
            loss, metrics = loss_fn(logprobs, *args, **kwargs)
            if calls["n"] >= step:
                if kind == "nan-loss":
                    loss = loss * float("nan")
                else:  # d/dx sqrt(x) at 0 is inf; times 0 it is NaN, while the value stays 0
                    s = logprobs.sum()
                    loss = loss + 0.0 * torch.sqrt(s - s.detach())
            return loss, metrics
        trainer.policy_update = counted_update
        update.policy_loss = bad_loss
    elif kind == "env-faults":
        import core.config.env_options as env_options  # where a run's environments are built
        make_env = env_options.make_env

        def faulty_env(*args, **kwargs):
            return _FaultyEnv(make_env(*args, **kwargs))
        env_options.make_env = faulty_env
    else:
        raise SystemExit(f"unknown fault {kind!r}")


class _FaultyEnv:
    """The real environment; some rollouts' tools misbehave (chosen by rollout index r)."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def episode(self, task, seed):
        return _FaultyEpisode(self._env.episode(task, seed))


class _FaultyEpisode:
    def __init__(self, episode):
        self._episode = episode

    def __getattr__(self, name):
        return getattr(self._episode, name)

    def step(self, action_text):
        from core.envs.base import StepResult
        mode = _ROLLOUT_INDEX.get(id(self))
        if mode == 0:
            raise RuntimeError("tool crashed: connection reset")
        if mode == 1:
            return {"observation": b"\xff\xfe garbage"}
        if mode == 2:
            return StepResult(observation="bad \udcff bytes", done=False, valid=True)
        return self._episode.step(action_text)


_ROLLOUT_INDEX: dict[int, int] = {}


def _track_rollout_index() -> None:
    """Tell each episode its rollout index r (trajectory ids end in -r{r})."""
    import core.rollout.engine as rollout
    row_init = rollout._Row.__init__

    def row_tracking(self, *args, **kwargs):
        row_init(self, *args, **kwargs)
        r = int(self.traj.traj_id.rsplit("-r", 1)[1])
        # the row holds the guard's episode (core/envs/guard.py); the faulty one is inside it
        _ROLLOUT_INDEX[id(getattr(self.episode, "inner", self.episode))] = r
    rollout._Row.__init__ = row_tracking


def main() -> int:
    fault = os.environ.get("AGENTRL_FAULT", "")
    if fault:
        kind, _, step = fault.partition("@")
        _install(kind, int(step or 0))
        if kind == "env-faults":
            _track_rollout_index()
    from core.commands.train import main as train_main
    return train_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
