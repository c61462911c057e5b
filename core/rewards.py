"""``core.rewards``: a fixed name (users' scripts call ``core.rewards.exact_match``). The reward
components are core/credit/rewards.py; answer matching is core/envs/answers.py."""
from core.credit.rewards import (COMPONENTS, cost_reward, exact_match, extract_answer,
                                 format_reward, normalize_answer, outcome_reward, process_reward,
                                 score, token_f1)

__all__ = ["COMPONENTS", "cost_reward", "exact_match", "extract_answer", "format_reward",
           "normalize_answer", "outcome_reward", "process_reward", "score", "token_f1"]
