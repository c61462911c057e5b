"""Smaller points of the credit audit, each on numbers worked by hand from its source's formula:
GiGPO's normalisation switch (verl-agent's mean_std_norm / mean_norm), verl's value clip in the
update, LOOP's |A| filter keeping one rollout per rank, and the Groups page naming the convention
that produced the advantages it shows."""
import math

import pytest
import torch

from core.config import ConfigError, TrainConfig, validate
from core.credit.assign import assign, drop_small_but_one
from core.learn.update import make_samples, policy_update
from core.model.policy import load_policy, token_logprobs
from pages import _credit
from storage import queries
from tests.credit_checks import fake_trajectory, one_rl_step, open_page  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# -- GiGPO: std | none, for the episode and the step terms (verl-agent core_gigpo.py mode) ---------
def _two_paths():
    """One group: a succeeds, b fails; both act from the start state at turn 0, from different
    states at turn 1 (a step group of one each)."""
    a, b = fake_trajectory("a", "g", 2, reward=1.0), fake_trajectory("b", "g", 2, reward=0.0)
    for t, second in ((a, "x"), (b, "y")):
        t.turns[0].state_key, t.turns[1].state_key = "start", second
    return [a, b]


@pytest.mark.parametrize("norm", ["std", "none"])
def test_gigpo_normalisation_by_hand(norm):
    trajs = _two_paths()
    credit = assign(trajs, TrainConfig(algo="gigpo", gigpo_norm=norm, gigpo_gamma=0.95,
                                       gigpo_episode_stats="trajectories"))
    # step returns (outcome on the last turn, gamma 0.95): a [0.95, 1.0], b [0, 0]
    # turn 0's anchor group {0.95, 0}: centred +-0.475, its unbiased std 0.95 / sqrt(2)
    # episode {1, 0}: centred +-0.5, its unbiased std 1 / sqrt(2); turn 1: groups of one -> 0
    if norm == "std":
        episode, step = 0.5 / (1 / math.sqrt(2)), 0.475 / (0.95 / math.sqrt(2))
    else:
        episode, step = 0.5, 0.475
    assert credit.turn_advantages[0] == pytest.approx([episode + step, episode], rel=1e-5)
    assert credit.turn_advantages[1] == pytest.approx([-episode - step, -episode], rel=1e-5)
    assert credit.advantage[0] == pytest.approx(episode, rel=1e-5)


def test_gigpo_episode_term_over_step_rows_as_verl_agent_releases_it():
    """verl-agent's default (compute_mean_std_cross_steps=True): each turn is a row carrying its
    trajectory's reward. A 1-turn success and a 3-turn failure: rows (1, 0, 0, 0), mean 0.25,
    unbiased std 0.5 -> +1.5 and -0.5 (the paper's one-entry-per-trajectory form: +-0.7071)."""
    win, loss = fake_trajectory("w", "g", 1, reward=1.0), fake_trajectory("l", "g", 3, reward=0.0)
    for t in (win, loss):
        for k, turn in enumerate(t.turns):
            turn.state_key = f"{t.traj_id}{k}"       # no shared states: the step term is 0
    credit = assign([win, loss], TrainConfig(algo="gigpo"))
    assert TrainConfig().gigpo_episode_stats == "steps"
    assert credit.advantage == pytest.approx([1.5, -0.5], rel=1e-5)
    assert credit.turn_advantages[1] == pytest.approx([-0.5] * 3, rel=1e-5)
    paper = assign([win, loss], TrainConfig(algo="gigpo", gigpo_episode_stats="trajectories"))
    assert paper.advantage == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-5)
    # mean_norm: centred only, rows (1, 0, 0, 0) -> 0.75 and -0.25
    centred = assign([win, loss], TrainConfig(algo="gigpo", gigpo_norm="none"))
    assert centred.advantage == pytest.approx([0.75, -0.25])
    # a group of a single row is not normalised there (mean 0, std 1): its raw reward
    alone = fake_trajectory("s", "h", 1, reward=0.6)
    alone.turns[0].state_key = "s0"
    assert assign([alone], TrainConfig(algo="gigpo")).advantage == pytest.approx([0.6], rel=1e-5)
    with pytest.raises(ConfigError, match="^gigpo_episode_stats="):
        validate(TrainConfig(gigpo_episode_stats="rows"))


def test_new_fields_are_validated_naming_themselves():
    for bad, why in ((dict(gigpo_norm="mean_norm"), "std .* or none"),
                     (dict(value_clip=-0.5), "must be >= 0")):
        with pytest.raises(ConfigError, match=rf"^{list(bad)[0]}=.*{why}"):
            validate(TrainConfig(**bad))
    cfg = TrainConfig()
    assert (cfg.gigpo_norm, cfg.value_clip) == ("std", 0.0)


# -- verl's value clip ---------------------------------------------------------------------------
def test_value_clip_in_the_update_by_hand():
    """verl: V_clip = V_old + clip(V - V_old, -c, c); loss 0.5 x max((V - R)^2, (V_clip - R)^2).
    With R = V (no error) and V_old = V + 2, c = 0.5: V_clip = V + 1.5, every token's clipped
    error 2.25 is the larger, so the loss is 0.5 x 2.25 and the clip fraction 1."""
    pol = load_policy("tiny", value_head=True, seed=0)
    traj = fake_trajectory("a", "g", 2, reward=1.0)
    ids, mask = torch.tensor([traj.token_ids]), torch.tensor([traj.trained])
    with torch.no_grad():
        values = token_logprobs(pol, ids, mask, with_values=True)["values"][0]
    opt = torch.optim.SGD(pol.trainable_parameters(), lr=0.0)
    metrics = {}
    for clip in (0.0, 0.5):
        cfg = TrainConfig(algo="ppo", value_clip=clip, kl_coef=0.0)
        samples = make_samples([traj], [torch.zeros(len(traj.token_ids))], [values],
                               [values + 2.0])
        metrics[clip] = policy_update(pol, opt, samples, cfg).metrics
    assert metrics[0.0]["value/loss"] == pytest.approx(0.0, abs=1e-9)
    assert "value/clipfrac" not in metrics[0.0]
    assert metrics[0.5]["value/loss"] == pytest.approx(0.5 * 1.5 ** 2, rel=1e-4)
    assert metrics[0.5]["value/clipfrac"] == 1.0


def test_a_ppo_step_with_the_value_clip_records_its_fraction(tmp_path):
    db, run = one_rl_step(tmp_path, "clip", algo="ppo", value_clip=0.5, record_info_gain=False)
    assert "value/clipfrac" in set(queries.metrics(db, run)["name"])


# -- LOOP's |A| filter: at least one rollout per rank ---------------------------------------------
def test_loop_filter_keeps_one_rollout_per_rank():
    filtered = [False, False, False, False, True]  # e dropped before (StarPO-S): not brought back
    largest = [0.0, 0.005, 0.5, 0.0, 0.9]
    kept = drop_small_but_one(filtered, [True] * 5, largest, 0.01, ranks_of=[0, 0, 1, 1, 0])
    # rank 0: nothing reaches 0.01, so its largest |A| (b, 0.005) stays; rank 1 keeps c alone
    assert kept == [True, False, False, True, True]
    assert filtered == [False, False, False, False, True]  # the flags given are not changed
    # one process: the batch keeps y; a rollout without trained tokens is never the one kept
    assert drop_small_but_one([False, False], [True, True], [0.002, 0.003], 0.01) == [True, False]
    assert drop_small_but_one([False, False], [True, False], [0.002, 0.003], 0.01) == [False, True]


# -- the Groups page names its conventions -------------------------------------------------------
def test_convention_lines_by_run_config():
    assert _credit.convention({"algo": "grpo"})[0].startswith("grpo: group-normalised")
    lines = _credit.convention({"algo": "gigpo", "gigpo_norm": "none", "w_spa": 0.5,
                                "w_prm": 1.0, "prm_gamma": 0.95, "min_abs_advantage": 0.01})
    assert any("normalisation none (mean_norm" in x for x in lines)
    assert any(x.startswith("SPA x 0.5: each turn's return-to-go") for x in lines)
    assert any("parsed action, gamma 0.95" in x for x in lines)
    assert any("one kept per rank" in x for x in lines)
    # a run recorded before these forms: its own conventions are named
    old = _credit.convention({"algo": "grpo", "w_spa": 1.0, "w_prm": 1.0, "w_info_gain": 1.0})
    assert any("over all turns (the form before" in x for x in old)
    assert any("action text, the plain mean outcome" in x for x in old)
    assert any("z-scored gains added" in x for x in old)
    assert _credit.convention({"algo": "grpo"}, imported=True) == [
        "as the source trainer recorded them (not recomputed here)"]


def test_groups_page_says_which_convention_produced_the_advantages(open_page, tmp_path):
    db, run = one_rl_step(tmp_path, "spa", w_spa=1.0, record_info_gain=False)
    step = int(queries.trajectories(db, run).iloc[0].step)
    at = open_page("groups", str(db), run=run, step=step)
    text = " ".join(c.value for c in at.caption)
    assert "Stored advantage, from training: grpo: group-normalised" in text
    assert "SPA x 1: each turn's return-to-go" in text
    gigpo = " ".join(m.value for m in at.markdown if "GiGPO step level" in m.value)
    assert "normalisation std" in gigpo and "as this run's config would give" in gigpo
