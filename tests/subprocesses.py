"""Job processes driven from tests: start a job's command line and kill it mid-run."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kill_at_first_progress(module: str, *args: str) -> int:
    """Run ``python -m module args``, SIGKILL it at its first ``progress`` line (its rollouts are
    under way, nothing is recorded yet) and return its exit code."""
    proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stdout:
            if line.startswith("progress"):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    return proc.returncode
