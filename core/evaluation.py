"""``python -m core.evaluation``: one checkpoint on another evaluation's held-out tasks. A fixed
name (users' scripts call it); the command is core/commands/evaluate.py."""
import sys

from core.commands.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
