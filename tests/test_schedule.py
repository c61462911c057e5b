"""When held-out evaluation runs: after SFT, every eval_every RL steps, at the end, and — with
sft_eval_every — along the SFT phase, which gives the held-out curve of the SFT budget."""
import json

from core.config import TrainConfig
from core.run.schedule import Schedule


class _Env:
    def tasks(self, split, n, seed):
        return [f"{split}-{i}" for i in range(n)]

    def split_size(self, split):
        return 64


def _due(**kw) -> list[int]:
    cfg = TrainConfig(eval_tasks=4, **kw)
    schedule = Schedule(cfg, _Env())
    return [s for s in range(1, cfg.sft_steps + cfg.steps + 1) if schedule.eval_due(s)]


def test_without_sft_eval_every_only_the_end_of_sft_and_the_rl_cadence():
    assert _due(sft_steps=10, steps=7, eval_every=5) == [10, 15, 17]


def test_sft_eval_every_adds_points_along_the_sft_phase():
    assert _due(sft_steps=100, steps=2, eval_every=1, sft_eval_every=20) == [20, 40, 60, 80, 100,
                                                                             101, 102]
    assert _due(sft_steps=50, steps=0, eval_every=5, sft_eval_every=20) == [20, 40, 50]


def test_no_evaluation_at_all_when_eval_every_is_zero():
    assert _due(sft_steps=40, steps=4, eval_every=0, sft_eval_every=20) == []


def test_eval_seed_gives_runs_of_other_seeds_the_same_held_out_tasks(tmp_path):
    """By default the held-out draw follows the run's seed; with one eval_seed, runs of seeds 0
    and 1 evaluate the same tasks with the same episode seeds, so Compare pairs every task."""
    from core.config import validate
    from core.run.trainer import train
    from storage import queries
    from storage.recorder import Recorder

    def evaluated(seed: int, eval_seed: int) -> tuple[str, str]:
        cfg = validate(TrainConfig(env="search", model="tiny", steps=0, sft_steps=0, eval_every=1,
                                   eval_tasks=6, max_turns=1, max_new_tokens=4, threads=1,
                                   seed=seed, eval_seed=eval_seed,
                                   db=str(tmp_path / f"s{seed}-e{eval_seed}.duckdb"),
                                   checkpoint_dir=str(tmp_path / "ckpt")))
        return cfg.db, train(cfg, Recorder(cfg.db), progress=False)

    def tasks(db, run):
        t = queries.trajectories(db, run)
        return set(t[t["split"] == "eval"]["task_id"])
    a, b = evaluated(0, -1), evaluated(1, -1)
    assert tasks(*a) != tasks(*b)  # the run's own seed draws the held-out tasks
    a, b = evaluated(0, 3), evaluated(1, 3)
    assert tasks(*a) == tasks(*b) and len(tasks(*a)) == 6
    # the same episodes: the same episode seed for every task
    def episodes(db, run):
        t = queries.trajectories(db, run)
        t = t[t["split"] == "eval"]
        return sorted((task, json.loads(info)["episode_seed"])
                      for task, info in zip(t["task_id"], t["info"]))
    assert episodes(*a) == episodes(*b)
