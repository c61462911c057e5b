"""``agentrl``: one front door for the product's commands (pyproject.toml's console script).

Each subcommand hands the rest of the command line to its command's ``main``, the one the
``python -m`` name users' scripts call runs too, so ``agentrl train ARGS`` is ``python -m
core.train ARGS`` and so on:

    train     python -m core.train              train and record one run
    branch    python -m core.branch             branch-from-turn continuations of a trajectory
    evaluate  python -m core.evaluation         a checkpoint on another evaluation's tasks
    clusters  python -m core.clusters           failure clusters of a run
    import    python -m storage.io import       a dump, JSONL, TRL, Inspect or messages file
    export    python -m storage.io export       a run to JSONL, Parquet, OTLP spans or SFT messages
    follow    python -m storage.io follow       import a folder's files as they appear
    otlp      python -m storage.otlp            receive agents' OpenTelemetry traces, live
    otlp-scores  python -m storage.otlp.scores  rewards graded later, keyed by trace id
    behaviours  python -m storage.behaviours    what the advantage paid for, per behaviour
    store     python -m storage.store_command   make a team store, copy runs between stores
    endpoint  python -m core.endpoint_server    a local model over the OpenAI-compatible protocol
    app       streamlit run app.py              the web app (as ``make run`` serves it)
"""
from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

COMMANDS = {
    "train": ("core.commands.train", []),
    "branch": ("core.commands.branch", []),
    "evaluate": ("core.commands.evaluate", []),
    "clusters": ("core.commands.clusters", []),
    "import": ("storage.io", ["import"]),
    "export": ("storage.io", ["export"]),
    "follow": ("storage.io", ["follow"]),
    "endpoint": ("core.commands.endpoint", []),
    "otlp": ("storage.otlp.receiver", []),
    "otlp-scores": ("storage.otlp.scores", []),
    "behaviours": ("storage.behaviours.job", []),
    "store": ("storage.store_command", []),
}
APP = Path(__file__).resolve().parents[2] / "app.py"


def _usage() -> str:
    table = __doc__.split("\n\n")[2].rstrip('"\n')
    return f"usage: agentrl COMMAND [ARGS...]  (agentrl COMMAND --help for its options)\n\n{table}"


def _app(argv: list[str]) -> int:
    """The web app, served by Streamlit with the same settings as ``make run``."""
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.fileWatcherType", "none",
           "--browser.gatherUsageStats", "false", *argv]
    return subprocess.call(cmd, cwd=APP.parent)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "app":
        return _app(rest)
    if command not in COMMANDS:
        print(f"agentrl: unknown command {command!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module, head = COMMANDS[command]
    # Imported on use: each command's module loads only what that command needs (torch for
    # training, none for import/export).
    return importlib.import_module(module).main([*head, *rest]) or 0
