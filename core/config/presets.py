"""The presets the CLI (--preset) and the app's launcher offer: each a dict of TrainConfig fields
whose values override the defaults (core.config.preset builds one). Kept apart from the config
because each carries the measurement that chose its values."""
from __future__ import annotations

from typing import Any

from core.config.budget import ConfigError
from core.config.train_config import TrainConfig

# Presets the CLI (--preset) and the app's launcher offer. Values override TrainConfig defaults.
PRESETS: dict[str, dict[str, Any]] = {
    # Bandit on the tiny model. Its random, tied embeddings bound its logits, so LoRA covers
    # lm_head too. SFT on a coin-flipping expert teaches the answer format only (greedy then
    # always pulls the same arm: held-out success 0); Dr.GRPO then teaches the higher-EV arm:
    # held-out success 0 -> 1.0 (n=32) by RL step 10 (0 at step 5: RL starts from SFT's AdamW
    # moments, rl_moments=sft; a fresh AdamW got there by step 5), seed 0, ~3 min on 2 CPU
    # cores. GRPO's std normalisation blows up the noise of the risky arm's 0/1 payouts and did
    # not learn in 10 steps; with a fresh AdamW, lr above 1e-3 wrecked the format in one update
    # (1e-2: valid answers 1.0 -> 0; from SFT's moments they stay 1.0, docs/learning.md). task_pool=256 (the pool size these
    # figures and the collapse sample run were measured with): which arm the coin-flip demos
    # happen to favour depends on the tasks drawn, and with the whole split seed 0's SFT already
    # favours the better arm (held-out 1.0 before any RL: nothing left for the demo to show).
    # eval_every=1: held-out success after every RL step (0.0 up to RL step 5, 1.0 from step 6,
    # seed 0), so the Train page draws when the choice flips, not three points with one jump;
    # eleven greedy evaluations of 32 one-turn tasks cost no measurable wall time (133 s against
    # 154 s with eval_every=5, both on 2 cores shared with other jobs, load 5-8).
    "workshop-demo": dict(env="bandit", model="tiny", algo="dr_grpo", steps=10, sft_steps=30,
                          task_pool=256,
                          env_options="expert=uniform", sft_lr=5e-3, lr=1e-3,
                          lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,"
                                       "lm_head",
                          group_size=8, tasks_per_step=4, max_turns=1, max_new_tokens=12,
                          eval_every=1, eval_tasks=32, threads=1),
    # Multi-turn credit on the tiny model (sample_runs/credit.md, section 13, the credit grid's
    # setup): a 3x3 lake without slips, one move a turn, 6 moves, reward 1 at the goal only.
    # 80 SFT steps teach the answer format but not where to go: greedy answers Up at every turn
    # (held-out 0 of 32), sampled ones reach the goal about 1 time in 5 (pass@G > 0). GiGPO's
    # step groups (one anchor per cell) then credit each move, not the whole walk. What it shows
    # is small: the greedy policy switches from Up to the best single move (Left at every turn:
    # held-out 0 -> 0.125 at the first evaluation, 4 RL steps, flat to the end; measured 385 s
    # wall on 2 shared cores at load 6-9), and Groups shows GiGPO's per-move advantages. No
    # method of the grid learned to read the lake in 16 steps, and other seeds switched to moves
    # that solve nothing (the best fixed 6-move sequence would solve 18 of the 32 held-out
    # lakes, reading the lake all 32). No KL term, as in the grid. lr 1e-3 over 60 RL steps did
    # no better (section 13b: GRPO, GiGPO, RLOO, PRM x 3 seeds, final held-out 0-0.125, one
    # move each): the SFT start's moves are near uniform in every cell, so RL shifts one global
    # preference; this shorter budget shows the same in a quarter of the steps.
    "lake-credit": dict(env="frozenlake", model="tiny", algo="gigpo", steps=16, sft_steps=80,
                        env_options="size=3,slip=0,actions_per_turn=1,max_actions=6",
                        sft_lr=5e-3, lr=3e-3, kl_coef=0.0,
                        lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,"
                                     "lm_head",
                        group_size=8, tasks_per_step=2, max_turns=6, max_new_tokens=12,
                        eval_every=4, eval_tasks=32, eval_seed=0, threads=1),
    # Per-turn credit that a teacher can watch work (sample_runs/credit.md, section 14, the
    # corridor grid's setup): corridors of 4-8 cells, the goal at the right end, Left or Right a
    # turn, the distance plus 4 moves, reward 1 at the goal only. 30 SFT steps on coin-flip moves
    # teach the format (sampled held-out success ~0.3: a walk arrives when its Rights outnumber
    # its Lefts by enough); GiGPO's step groups (one anchor per cell) then pay each Right and
    # charge each Left, even inside one walk. Held-out success is sampled at temperature 1, so
    # the curve rises with P(Right) instead of jumping when the greedy move flips.
    "corridor-credit": dict(env="corridor", model="tiny", algo="gigpo", steps=30, sft_steps=30,
                            env_options="size=6,slack=4,expert=uniform", sft_lr=5e-3, lr=5e-4,
                            kl_coef=0.0, gigpo_episode_stats="steps",
                            lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
                                         "down_proj,lm_head",
                            group_size=8, tasks_per_step=2, max_turns=14, max_new_tokens=10,
                            eval_every=3, eval_tasks=32, eval_seed=0, eval_temperature=1.0,
                            threads=1),
    # The measured recipe (sample_runs/README.md, run 1): SFT on half single-, half two-hop
    # demonstrations teaches the format; GRPO at temperature 0.7 (EM + 0.2 x retrieval hit) on the
    # same mix gives groups that disagree. The held-out set stays the original 75%-two-hop one.
    # (SFT on 10% two-hop then RL on 75% two-hop left every RL group at reward 0: pass@G = 0.)
    # task_pool=256: the pool the sample run was recorded with (`make.sh search` reproduces it).
    "search-smollm2": dict(env="search", model="smollm2-135m", algo="grpo", steps=10, task_pool=256,
                           sft_steps=20, group_size=8, tasks_per_step=4, max_turns=4,
                           lr=2e-4, sft_lr=2e-4, temperature=0.7, eval_every=5, eval_tasks=100,
                           env_options="two_hop_frac=0.5", sft_env_options="two_hop_frac=0.5",
                           eval_env_options="two_hop_frac=0.75", w_process=0.2,
                           max_grad_norm=1.0),
    # The apps world needs more turns and room for its longer observations.
    "apps-smollm2": dict(env="apps", model="smollm2-135m", algo="grpo", steps=20, sft_steps=20,
                         group_size=4, tasks_per_step=2, max_turns=8, max_obs_tokens=512,
                         max_context=2048, eval_every=10, eval_tasks=16),
    "apps-tiny": dict(env="apps", model="tiny", algo="grpo", steps=4, sft_steps=2,
                      group_size=2, tasks_per_step=2, max_turns=8, max_obs_tokens=512,
                      max_context=2048, max_new_tokens=48, eval_every=2, eval_tasks=4),
    "tiny-smoke": dict(env="search", model="tiny", algo="grpo", steps=2, group_size=2,
                       tasks_per_step=2, max_turns=2, max_new_tokens=16, eval_every=0),
}


def preset(name: str) -> TrainConfig:
    """The TrainConfig of a named preset."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; one of {', '.join(PRESETS)}")
    return TrainConfig.from_dict(PRESETS[name])
