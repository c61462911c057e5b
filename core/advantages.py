"""``core.advantages``: a fixed name (users' scripts call ``core.advantages.ESTIMATORS``). The
estimators are core/credit/advantages.py."""
from core.credit.advantages import ESTIMATORS, gae, token_advantages

__all__ = ["ESTIMATORS", "gae", "token_advantages"]
