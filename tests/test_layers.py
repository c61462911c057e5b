"""The package layers hold (pyproject.toml's import-linter contracts), and docs/architecture.md's
picture is the one the code draws."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_import_contracts_are_kept():
    lint = Path(sys.executable).parent / "lint-imports"
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_architecture_picture_is_current():
    done = subprocess.run([sys.executable, "tools/architecture.py", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_no_import_circles_anywhere():
    done = subprocess.run([sys.executable, "tools/architecture.py", "--figures"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "circles 0" in done.stdout, done.stdout


def test_the_front_door_lists_every_command():
    agentrl = [sys.executable, "-m", "core.cli"]
    done = subprocess.run(agentrl, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    for command in ("train", "branch", "evaluate", "import", "export", "follow", "app"):
        assert f"\n    {command} " in done.stdout
    bad = subprocess.run([*agentrl, "nope"], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown command 'nope'" in bad.stderr
    help_ = subprocess.run([*agentrl, "export", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert help_.returncode == 0 and "--out" in help_.stdout
