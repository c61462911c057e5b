"""``python -m storage.behaviours``: the same job as ``agentrl behaviours`` (``-m
storage.behaviours.job`` would run job.py a second time beside the copy the package imports)."""
import sys

from storage.behaviours.job import main

sys.exit(main())
