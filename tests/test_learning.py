"""Proof that training changes behaviour on held-out tasks, fast, with a fixed seed.

What is proven here: the SFT warm start of the workshop-demo configuration (tiny model, bandit,
coin-flipping expert) teaches the answer format. Held-out valid-action ratio is measured by the
trainer's own evaluation, once before any training and once right after SFT, on the same 64
held-out tasks, greedy.

The margin: with n held-out episodes a rate has a binomial standard error of at most
sqrt(0.25 / n) (0.0625 for n = 64). The test requires a gain larger than 4 such standard errors
(0.25), which chance variation of one rate around a fixed value does not reach (p < 1e-4).

Not proven here: that the following RL steps raise the arm choice on the tiny model; measured,
20 GRPO steps at lr 1e-3 did not (see sample_runs/README.md and the estimator table).
"""
import math

import pytest
import torch

from core.config import PRESETS, TrainConfig
from core.trainer import train
from storage.recorder import NullRecorder

EVAL_TASKS = 64
MARGIN = 4 * math.sqrt(0.25 / EVAL_TASKS)
"""Four binomial standard errors at the widest (p = 0.5)."""


class MetricsRecorder(NullRecorder):
    """Keeps the metrics of every recorded step in memory (the rest is dropped)."""

    def __init__(self):
        self.steps: dict[int, dict] = {}

    def record_step(self, step: int, metrics=None, **tables) -> None:
        self.steps[step] = dict(metrics or {})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _eval(cfg: TrainConfig, step: int) -> dict:
    rec = MetricsRecorder()
    train(cfg, rec, progress=False)
    return rec.steps[step]


def test_sft_warm_start_teaches_the_format_on_heldout_tasks(tmp_path):
    demo = {**PRESETS["workshop-demo"], "eval_tasks": EVAL_TASKS, "steps": 0, "seed": 0,
            "db": str(tmp_path / "unused.duckdb"), "checkpoint_dir": str(tmp_path / "ckpt")}
    before = _eval(TrainConfig.from_dict({**demo, "sft_steps": 0}), step=0)
    after = _eval(TrainConfig.from_dict(demo), step=demo["sft_steps"])
    assert before["eval/tasks"] == after["eval/tasks"] == EVAL_TASKS
    gain = after["eval/valid_action_ratio"] - before["eval/valid_action_ratio"]
    assert gain > MARGIN, (before["eval/valid_action_ratio"], after["eval/valid_action_ratio"])
    assert after["sft/loss"] < 1.0
