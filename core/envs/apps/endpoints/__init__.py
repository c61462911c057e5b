"""The endpoints of the apps world, 40 in all, one module per group of apps: documentation,
contacts and email (mail.py); calendar, notes and todo (plans.py); wallet (wallet.py).
Importing this package registers them all in ``core.envs.apps.api.ENDPOINTS``."""
from core.envs.apps.endpoints import mail, plans, wallet  # noqa: F401
