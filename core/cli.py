"""``agentrl``'s entry point as pyproject.toml declares it (``core.cli:main``), and ``python -m
core.cli``; the front door itself is core/commands/agentrl.py."""
import sys

from core.commands.agentrl import main

if __name__ == "__main__":
    sys.exit(main())
