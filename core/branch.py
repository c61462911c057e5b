"""``python -m core.branch``: branch-from-turn continuations of a recorded trajectory. A fixed name
(users' scripts call it); the command is core/commands/branch.py."""
import sys

from core.commands.branch import main

if __name__ == "__main__":
    sys.exit(main())
