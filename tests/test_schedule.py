"""When held-out evaluation runs: after SFT, every eval_every RL steps, at the end, and — with
sft_eval_every — along the SFT phase, which gives the held-out curve of the SFT budget."""
from core.config import TrainConfig
from core.schedule import Schedule


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
