"""The GPU proof's child processes: each training run (and the SFT start) is its own process with
its own log, started in the proof's environment, stopped at the budget with SIGINT (the trainer
finishes its step, evaluates if due, saves and marks the run stopped) and killed at a later
deadline; while they run, a heartbeat prints each run's last recorded step and the GPU's
memory in use (nvidia-smi, sampled every 2 s, kept for proof.json).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


class Children:
    """Child processes with a log each, a stop (SIGINT: the trainer finishes its step) and a
    kill deadline; while waiting, a heartbeat and the GPU's memory sampled by nvidia-smi."""

    def __init__(self, logs: Path, env: dict):
        self.logs, self.env, self.procs = logs, env, {}
        self.samples: list[tuple[float, float, float]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, key: str, argv: list[str]) -> None:
        log = open(self.logs / f"{key}.log", "w")
        self.procs[key] = subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT)
        log.close()

    def wait(self, stop_at: float, kill_at: float, beat_s: float, stores: dict) -> dict:
        stopped, last_beat, t0 = False, 0.0, time.monotonic()
        while any(p.poll() is None for p in self.procs.values()):
            now = time.monotonic()
            if not stopped and now >= stop_at:
                stopped = True
                print(f"  budget: stopping {self.alive()} (each finishes its step)", flush=True)
                for p in self.procs.values():
                    if p.poll() is None:
                        p.send_signal(signal.SIGINT)
            if now >= kill_at:
                print(f"  budget: killing {self.alive()}", flush=True)
                for p in self.procs.values():
                    if p.poll() is None:
                        p.kill()
                break
            self._sample(now - t0)
            if now - last_beat >= beat_s:
                last_beat = now
                steps = {k: _last_step(s) for k, s in stores.items()}
                mem = f", GPU {self.samples[-1][1]:.0f} MiB used" if self.samples else ""
                print(f"  {now - t0:4.0f} s: {self.alive()} running{mem}; last steps "
                      + " ".join(f"{k}:{v}" for k, v in steps.items()), flush=True)
            time.sleep(2)
        return {k: p.wait() for k, p in self.procs.items()}

    def alive(self) -> str:
        return ",".join(k for k, p in self.procs.items() if p.poll() is None) or "none"

    def _sample(self, t: float) -> None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used,utilization.gpu",
                                  "--format=csv,noheader,nounits"], capture_output=True,
                                 text=True, timeout=10).stdout.split(",")
            self.samples.append((round(t, 1), float(out[0]), float(out[1])))
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass  # no nvidia-smi (the CPU rehearsal): no samples


def _last_step(store: str) -> str:
    """A run's last recorded step, read between its writes (storage's fair lock; '-' if busy)."""
    from storage import db
    try:
        with db.reading(store, timeout_s=1.0) as con:
            return str(con.execute("SELECT max(last_step) FROM runs").fetchone()[0])
    except Exception:
        return "-"
