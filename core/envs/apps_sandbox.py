"""Runs the apps env's ``<code>`` action: untrusted Python in an isolated subprocess whose only
way to touch the world is an ``apis`` object whose calls are proxied back over a pipe.

Why a proxy and not a copy of the database: every call the code makes is executed here, in the
parent, by the same ``handle_call`` as a ``<tool>`` action, so the episode's database ends up
exactly as if the calls had been made one by one as tools, and each write is logged as a diff.

Containment, outermost first (see apps_sandbox_child.py for how each is applied):
  1. here: the source is parsed and refused if it names anything starting with '__' or reads
     an attribute starting with '_' or a frame/code/traceback internal (gi_, cr_, ag_, f_, tb_,
     co_) — the routes from a plain object to ``os`` — before any process starts;
  2. a fresh ``python -I -S`` process (no site, no environment, no project imports) started
     in a new session in an empty temporary directory, with an empty environment;
  3. in that process: network + pid namespaces, chroot into the temp dir, privileges dropped,
     rlimits on CPU, address space, file size (0), open files and processes (0);
  4. restricted builtins and a whitelist import hook inside the process;
  5. here again: a wall-clock deadline, a cap on calls and on bytes read, and the whole process
     group killed with SIGKILL when the job ends, whatever happened.
Layers 2-5 each hold on their own; which of the kernel layers applied is reported in
``SandboxResult.layers`` (they need root or unprivileged user namespaces).
"""
from __future__ import annotations

import ast
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

CHILD = str(Path(__file__).with_name("apps_sandbox_child.py"))
MAX_CODE_CHARS = 20_000
MAX_LINE_BYTES = 1 << 20
_BLOCKED_ATTR = re.compile(r"^(_|gi_|cr_|ag_|f_|tb_|co_)")

CallHandler = Callable[[str, Any], tuple[bool, Any]]
"""handle_call(name, arguments) -> (True, result) or (False, error message)."""


@dataclass
class SandboxResult:
    output: str
    """What the code printed (capped)."""
    error: str | None
    """Why the code failed (its exception, a limit hit, a refused construct), or None."""
    calls: int = 0
    """API calls the code made (each executed by handle_call)."""
    layers: list[str] = field(default_factory=list)
    """Kernel-level isolation layers that were applied in the child."""
    wall_s: float = 0.0


# ---- layer 1: refuse the source before running it ----------------------------------------------
def check_source(code: str) -> str | None:
    """None if ``code`` may run, else why not (syntax error or a blocked name/attribute)."""
    if len(code) > MAX_CODE_CHARS:
        return f"code is longer than {MAX_CODE_CHARS} characters"
    try:
        tree = ast.parse(code, "<code>")
    except SyntaxError as exc:
        return f"SyntaxError (line {exc.lineno}): {exc.msg}"
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Attribute) and _BLOCKED_ATTR.match(node.attr):
            return f"line {line}: access to attribute {node.attr!r} is not allowed"
        if isinstance(node, ast.Name) and node.id.startswith("__"):
            return f"line {line}: the name {node.id!r} is not allowed"
        if isinstance(node, ast.alias) and node.name.startswith("_"):
            return f"line {line}: importing {node.name!r} is not allowed"
        if isinstance(node, ast.MatchClass) and any(_BLOCKED_ATTR.match(a) for a in node.kwd_attrs):
            return f"line {line}: matching on private attributes is not allowed"
    return None


# ---- the parent side of the pipe -----------------------------------------------------------------
def _write_all(fd: int, data: bytes, deadline: float) -> bool:
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_WRITE)
    try:
        while data:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                return False
            data = data[os.write(fd, data):]
        return True
    except OSError:  # the child closed its end (it died): nothing more to say
        return False
    finally:
        sel.close()


def _ended_message(rc: int | None, stderr: bytes, cpu_s: int) -> str:
    sig = -rc if rc is not None and rc < 0 else rc - 128 if rc is not None and rc > 128 else 0
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return f"TimeoutError: CPU time limit of {cpu_s} s exceeded (process killed)"
    tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
    if "MemoryError" in tail[0]:
        return "MemoryError: memory limit exceeded"
    return f"the code's process ended without a result (exit code {rc}): {tail[0][:200]}"


def run_code(code: str, handle_call: CallHandler, *, cpu_s: int = 2, wall_s: float = 6.0,
             mem_mb: int = 256, max_calls: int = 100, max_output: int = 4000,
             guard: bool = True, preload: tuple[str, ...] = (),
             nofile: int = 3) -> SandboxResult:
    """Run ``code`` in the sandbox; its ``apis.app.endpoint(**kw)`` calls go to handle_call.

    ``guard=False`` skips layers 1 and 4 so tests can probe the kernel layers on their own with
    raw Python; ``preload`` names modules imported before isolation (the chroot hides the
    standard library afterwards); ``nofile`` > 3 lets such a test open sockets and files so
    the layers behind the descriptor limit are probed too. The environment uses the defaults.
    """
    start = time.monotonic()
    if guard:
        refused = check_source(code)
        if refused:
            return SandboxResult("", refused)
    root = tempfile.mkdtemp(prefix="apps-code-")
    job = {"code": code, "guard": guard, "cpu_s": cpu_s, "mem_mb": mem_mb, "root": root,
           "max_calls": max_calls, "max_output": max_output, "preload": list(preload),
           "nofile": nofile}
    try:
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-B", CHILD], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=root, env={},
                                start_new_session=True, close_fds=True)
    except OSError as exc:  # out of processes or memory on the host: this action fails, not the run
        shutil.rmtree(root, ignore_errors=True)
        return SandboxResult("", f"the sandbox could not start: {exc}")
    deadline = start + wall_s
    result = SandboxResult("", None)
    try:
        done = _converse(proc, job, handle_call, deadline, max_calls, result)
        if done == "wall":
            result.error = f"TimeoutError: wall time limit of {wall_s:g} s exceeded"
        elif done == "protocol":
            result.error = "the code's process wrote something other than API calls to its pipe"
        elif done == "died":
            try:  # it closed its pipe: it is exiting; its exit status says why
                proc.wait(timeout=max(0.05, min(1.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                pass
            result.error = _ended_message(proc.returncode, _stderr_tail(proc), cpu_s)
        else:
            try:  # it exits right after its last line; killing it mid-exit would orphan the
                proc.wait(timeout=1.0)  # grandchild and leave it for init to reap
            except subprocess.TimeoutExpired:
                pass
            result.output = str(done.get("output", ""))[:max_output + 40]
            result.error = done.get("error")
            result.layers = [str(x) for x in done.get("layers", [])][:20]
    finally:
        _kill(proc)
        shutil.rmtree(root, ignore_errors=True)
    result.wall_s = time.monotonic() - start
    return result


def _converse(proc, job, handle_call, deadline, max_calls, result) -> dict | str:
    """Serve the child's API calls until its 'done' line (returned); else why it stopped:
    'wall' (deadline passed), 'died' (pipe closed first), 'protocol' (garbage on the pipe)."""
    stdin_fd, stdout_fd = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(stdin_fd, False)
    if not _write_all(stdin_fd, (json.dumps(job) + "\n").encode(), deadline):
        return "wall" if time.monotonic() >= deadline else "died"
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(stdout_fd, selectors.EVENT_READ)
    try:
        while True:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                return "wall"
            chunk = os.read(stdout_fd, 65536)
            if not chunk:
                return "died"
            buf.extend(chunk)
            while b"\n" in buf:
                line, _, rest = bytes(buf).partition(b"\n")
                buf[:] = rest
                msg = json.loads(line)
                if not isinstance(msg, dict):
                    raise ValueError("not an object")
                if msg.get("done"):
                    return msg
                result.calls += 1
                if result.calls > max_calls:  # the child counts too; this holds if it lies
                    ok, value = False, f"more than {max_calls} API calls"
                else:
                    ok, value = handle_call(msg.get("call"), msg.get("args"))
                reply = {"ok": value} if ok else {"error": str(value)}
                if not _write_all(stdin_fd, (json.dumps(reply) + "\n").encode(), deadline):
                    return "wall" if time.monotonic() >= deadline else "died"
            if len(buf) > MAX_LINE_BYTES:
                return "protocol"
    except (ValueError, UnicodeDecodeError, TypeError):  # not our JSON: stop listening to it
        return "protocol"
    finally:
        sel.close()


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group (it is its own session), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    # The code ran in a grandchild (inside the pid namespace) that we cannot wait for: give the
    # kernel a moment to finish killing it, so no sandbox process outlives its action.
    for _ in range(50):
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            break
        time.sleep(0.01)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass


def _stderr_tail(proc: subprocess.Popen) -> bytes:
    """What the dead child left on stderr, without waiting on a straggler that holds it."""
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        return (proc.stderr.read(65536) or b"")[-4096:]
    except (OSError, ValueError):
        return b""
