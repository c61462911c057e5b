"""Every ``--algo`` name, declared once in the registry (core/algorithms/registry.py), torch-free.
An algorithm is an outcome estimator (core/algorithms/estimators.py), a credit step
(core/credit/assign.py) and the config defaults it is defined with:

    name      outcome estimator  credit step  defaults it is defined with         value head
    grpo      grpo               outcome      -                                   no
    dr_grpo   dr_grpo            outcome      -                                   no
    rloo      rloo               outcome      -                                   no
    ppo       -                  gae          -                                   yes
    starpo_s  grpo               starpo_s     clip-higher 0.2/0.28, no KL         no
    gigpo     grpo               gigpo        -                                   no
    loop      rloo               outcome      log clip 0.1, per-rollout mean,     no
                                              |A| >= 0.01, no KL
"""
from __future__ import annotations

from core.algorithms import estimators  # noqa: F401 (registers the outcome estimators)
from core.algorithms.registry import REGISTRY, Algorithm

for _algo in (
    Algorithm("grpo", "group-normalised outcome advantage", "grpo", "outcome",
              source="Shao et al. 2024 (DeepSeekMath); Search-R1"),
    Algorithm("dr_grpo", "group mean baseline, no std division", "dr_grpo", "outcome",
              source="Liu et al. 2025 (Understanding R1-Zero)"),
    Algorithm("rloo", "leave-one-out baseline", "rloo", "outcome", source="Kool et al. 2019"),
    Algorithm("ppo", "GAE with a learned value head", None, "gae", needs_value_head=True,
              group_based=False, source="Schulman et al. 2017; verl"),
    # RAGEN's StarPO-S: clip-higher (eps_low 0.2, eps_high 0.28) and no KL term.
    Algorithm("starpo_s", "GRPO on the top groups by reward std, clip-higher", "grpo", "starpo_s",
              defaults={"clip_eps_high": 0.28, "kl_coef": 0.0}, source="RAGEN (Wang et al. 2025)"),
    Algorithm("gigpo", "GRPO episode + anchor-state step advantage", "grpo", "gigpo",
              source="Feng et al. 2025 (verl-agent)"),
    # LOOP: per-token ratio clipped symmetrically in log space ([1/1.1, 1.1]), each rollout's
    # token losses averaged then averaged over rollouts, |A| < 0.01 dropped, no reference model.
    # Its other settings (6 rollouts per task, 2 epochs, grad norm 0.1, lr 5e-5) depend on the
    # model's scale and are left to the user.
    Algorithm("loop", "leave-one-out PPO: RLOO baseline, log-space clip, no critic", "rloo",
              "outcome",
              defaults={"clip_mode": "log", "clip_eps_low": 0.1, "clip_eps_high": 0.1,
                        "loss_agg": "seq-mean-token-mean", "min_abs_advantage": 0.01,
                        "kl_coef": 0.0},
              source="Chen et al. 2025 (LOOP, AppWorld)"),
):
    REGISTRY.algorithm(_algo)

ALGOS: tuple[str, ...] = tuple(REGISTRY.algorithms)
GROUP_ALGOS: tuple[str, ...] = tuple(n for n, a in REGISTRY.algorithms.items() if a.group_based)
resolve = REGISTRY.resolve
