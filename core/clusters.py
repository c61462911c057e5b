"""``python -m core.clusters``: failure clusters of a run. A fixed name (users' scripts call it);
the command is core/commands/clusters.py."""
import sys

from core.commands.clusters import main

if __name__ == "__main__":
    sys.exit(main())
