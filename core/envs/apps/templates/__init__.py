"""Task templates of the apps world, by theme: contacts and mail, the wallet, the calendar and
todos. Importing this package registers them all in ``core.envs.apps.tasks.TEMPLATES``."""
from core.envs.apps.templates import mail, money, time  # noqa: F401
