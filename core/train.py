"""``python -m core.train``: train and record one run. A fixed name (users' scripts call it); the
command is core/commands/train.py."""
import sys

from core.commands.train import main

if __name__ == "__main__":
    sys.exit(main())
