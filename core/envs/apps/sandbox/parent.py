"""Runs the apps env's ``<code>`` action: untrusted Python in an isolated subprocess whose only
way to touch the world is an ``apis`` object whose calls are proxied back over a pipe.

Why a proxy and not a copy of the database: every call the code makes is executed here, in the
parent, by the same ``handle_call`` as a ``<tool>`` action, so the episode's database ends up
exactly as if the calls had been made one by one as tools, and each write is logged as a diff.

Containment, outermost first (see child.py for how each is applied):
  1. here: the source is parsed and refused if it names anything starting with '__' or reads
     an attribute starting with '_' or a frame/code/traceback internal (gi_, cr_, ag_, f_, tb_,
     co_) — the routes from a plain object to ``os`` — before any process starts;
  2. a fresh ``python -I -S`` process (no site, no environment, no project imports) started
     in a new session with an empty environment — under bubblewrap where it works: new pid,
     network, IPC and UTS namespaces, a root holding only /usr and the interpreter, read-only,
     and ``--die-with-parent``;
  3. in that process: chroot into an empty directory, privileges dropped (nobody), the
     hand-written network + pid namespaces (where bubblewrap is missing, or nested inside it
     when unprivileged), rlimits on CPU,
     address space, file size (0), open files and processes (0);
  4. restricted builtins and a whitelist import hook inside the process;
  5. here again: a wall-clock deadline, a cap on calls and on bytes read, every line the child
     writes type-checked (anything else ends the action with a tool error), and the process
     tree killed innermost first when the job ends, whatever happened.
Layers 1 and 4 are conveniences, not walls: stdlib helpers that read an attribute named by a
string (functools.update_wrapper) reach the child's ``os``. What must hold against code that
has ``os`` is layers 2, 3 and 5: the code runs inside a pid namespace whose first process
(bubblewrap's init, or the hand-written one) is killed from outside, and a namespace dies with
that process, so no process started by an action outlives it (setsid or not). Which layers
applied is reported in ``SandboxResult.layers``: the parent's own ("bwrap" + "netns+pidns", or
"bwrap_missing") and the child's, read before the code ran.
"""
from __future__ import annotations

import ast
import functools
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

CHILD = str(Path(__file__).with_name("child.py"))
MAX_CODE_CHARS = 20_000
MAX_LINE_BYTES = 1 << 20
SANDBOX_CHILD, SANDBOX_ROOT = "/sandbox/child.py", "/sandbox/root"
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
    """Isolation layers applied: the parent's ("bwrap" and "netns+pidns", or "bwrap_missing")
    and the kernel layers the child reported before the code ran."""
    wall_s: float = 0.0


# ---- layer 1: refuse the source before running it ----------------------------------------------
def check_source(code: str) -> str | None:
    """None if ``code`` may run, else why not (syntax error or a blocked name/attribute)."""
    if len(code) > MAX_CODE_CHARS:
        return f"code is longer than {MAX_CODE_CHARS} characters"
    try:  # compiled here too, so the child never has a syntax error of its own to report
        tree = ast.parse(code, "<code>")
        compile(tree, "<code>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return f"SyntaxError (line {exc.lineno}): {exc.msg}"
    except (RecursionError, MemoryError):  # CPython's parser gives up on deep nesting this way
        return "SyntaxError: the code is nested too deeply to parse"
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


# ---- layer 2: bubblewrap, where it works ----------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bwrap_prefix() -> tuple[str, ...] | None:
    """The bubblewrap command line that starts the child (its script path goes last), or None
    where bubblewrap is missing or cannot start this interpreter (probed once per process).

    As root no user namespace is made: the child's setuid(nobody) must give a real uid, since
    RLIMIT_NPROC does not bind host root. As root bubblewrap would keep every capability: all
    are dropped but the three the child needs for chroot and setuid (which then drops them).
    Unprivileged, bubblewrap maps the user and leaves no capability.
    """
    bwrap = shutil.which("bwrap")
    if not bwrap:
        return None
    python = os.path.realpath(sys.executable)  # a venv's python is a link to the real install
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session"]
    if os.geteuid() == 0:
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SYS_CHROOT", "--cap-add", "CAP_SETUID",
                 "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user"]
    argv += ["--tmpfs", "/", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):  # merged-/usr links
        if os.path.islink(top):
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
    bound = [Path("/usr")]
    for path in (sys.base_prefix, sys.base_exec_prefix, python):  # resolved here, never fixed
        real = Path(os.path.realpath(path))
        if not any(real.is_relative_to(b) for b in bound):
            argv += ["--ro-bind", str(real), str(real)]
            bound.append(real)
    argv += ["--ro-bind", CHILD, SANDBOX_CHILD, "--dir", SANDBOX_ROOT, "--chdir", SANDBOX_ROOT,
             python, "-I", "-S", "-B"]
    try:
        probe = subprocess.run(argv + ["-c", "pass"], stdin=subprocess.DEVNULL,
                               capture_output=True, env={}, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(argv) if probe.returncode == 0 else None


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
    prefix = bwrap_prefix()
    if prefix:  # the child's root is an empty directory inside bubblewrap's own empty root
        root, argv, cwd, layers = None, [*prefix, SANDBOX_CHILD], "/", ["bwrap", "netns+pidns"]
    else:
        root = tempfile.mkdtemp(prefix="apps-code-")
        argv, cwd, layers = [sys.executable, "-I", "-S", "-B", CHILD], root, ["bwrap_missing"]
    job = {"code": code, "guard": guard, "cpu_s": cpu_s, "mem_mb": mem_mb,
           "root": root or SANDBOX_ROOT, "max_calls": max_calls, "max_output": max_output,
           "preload": list(preload), "nofile": nofile}
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=cwd, env={},
                                start_new_session=True, close_fds=True)
    except OSError as exc:  # out of processes or memory on the host: this action fails, not the run
        if root:
            shutil.rmtree(root, ignore_errors=True)
        return SandboxResult("", f"the sandbox could not start: {exc}", layers=layers)
    deadline = start + wall_s
    result = SandboxResult("", None, layers=layers)
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
            try:  # it exits right after its last line; let it, rather than kill it mid-exit
                proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            result.output = done["output"][:max_output + 40]
            result.error = done["error"]
            if guard and (result.error or "").startswith("SyntaxError"):  # it compiled above:
                result.error = f"the code reported {result.error}"  # this is the code's claim
    finally:
        _kill(proc)
        if root:
            shutil.rmtree(root, ignore_errors=True)
    result.wall_s = time.monotonic() - start
    return result


def _message(line: bytes, first: bool) -> dict | None:
    """The child's line as one of the three messages it may send, or None for anything else
    (the code may have written it: every key and type is checked, nothing is trusted):
    ``{"ready": true, "layers": [str]}`` (first line only, written before the code runs),
    ``{"call": str, "args": {...}}`` and ``{"done": true, "output": str, "error": str|null}``."""
    try:
        msg = json.loads(line)
    except Exception:  # ValueError, UnicodeDecodeError, RecursionError (deep nesting), ...
        return None
    if not isinstance(msg, dict):
        return None
    if first:
        layers = msg.get("layers")
        ok = set(msg) == {"ready", "layers"} and msg["ready"] is True \
            and isinstance(layers, list) and len(layers) <= 20 \
            and all(isinstance(x, str) and len(x) <= 40 for x in layers)
    elif "call" in msg:
        ok = set(msg) == {"call", "args"} and isinstance(msg["call"], str) \
            and isinstance(msg["args"], dict)
    else:
        ok = set(msg) == {"done", "output", "error"} and msg["done"] is True \
            and isinstance(msg["output"], str) \
            and (msg["error"] is None or isinstance(msg["error"], str))
        if ok and msg["error"] is not None:
            msg["error"] = msg["error"][:1000]
    return msg if ok else None


def _converse(proc, job, handle_call, deadline, max_calls, result) -> dict | str:
    """Serve the child's API calls until its 'done' line (returned); else why it stopped:
    'wall' (deadline passed), 'died' (pipe closed first), 'protocol' (anything but a message)."""
    stdin_fd, stdout_fd = proc.stdin.fileno(), proc.stdout.fileno()
    os.set_blocking(stdin_fd, False)
    if not _write_all(stdin_fd, (json.dumps(job) + "\n").encode(), deadline):
        return "wall" if time.monotonic() >= deadline else "died"
    buf, ready = bytearray(), False
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
                msg = _message(line, first=not ready)
                if msg is None:
                    return "protocol"
                if not ready:
                    ready = True
                    result.layers += [x for x in msg["layers"] if x not in result.layers]
                    continue
                if "call" not in msg:
                    return msg
                result.calls += 1
                if result.calls > max_calls:  # the child counts too; this holds if it lies
                    ok, value = False, f"more than {max_calls} API calls"
                else:
                    ok, value = handle_call(msg["call"], msg["args"])
                reply = {"ok": value} if ok else {"error": str(value)}
                if not _write_all(stdin_fd, (json.dumps(reply) + "\n").encode(), deadline):
                    return "wall" if time.monotonic() >= deadline else "died"
            if len(buf) > MAX_LINE_BYTES:
                return "protocol"
    finally:
        sel.close()


# ---- layer 5: no process outlives its action ---------------------------------------------------------
def _kill(proc: subprocess.Popen) -> None:
    """End the child's process tree innermost first, so that each process is reaped by its own
    parent (PID 1 of these machines reaps no orphan: a zombie left to it is a PID lost).

    The child's children are the first process of a pid namespace (bubblewrap's init, or the
    hand-written one's) that the code runs in: SIGKILL to it kills every process in that
    namespace — whatever session it moved to — and it exits only once they are all reaped.
    Its parent (bubblewrap, or the child's waiting half) then reaps it and exits, and we reap
    that. Where there is no pid namespace the code runs in ``proc`` itself, which cannot fork
    (RLIMIT_NPROC 0 as nobody)."""
    children = _children(proc.pid)
    for pid in children:
        _kill_child(pid, proc.pid)
    if children:
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
            try:
                kill()
            except (ProcessLookupError, PermissionError):
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        try:
            pipe.close()
        except OSError:
            pass


def _children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (its single thread's children list, else a /proc scan)."""
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return [p for p in _all_pids() if _parent(p) == pid]


def _all_pids() -> list[int]:
    try:
        return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]
    except OSError:
        return []


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _kill_child(pid: int, parent: int) -> None:
    """SIGKILL ``pid`` through a pidfd, once it is checked to still be ``parent``'s child (the
    pid cannot have been reused by then: only ``parent`` could reap it, and it forks no more)."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # already gone, or a kernel/Python without pidfds
        if _parent(pid) == parent:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return
    try:
        if _parent(pid) == parent:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(fd)


def _stderr_tail(proc: subprocess.Popen) -> bytes:
    """What the dead child left on stderr, without waiting on a straggler that holds it."""
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        return (proc.stderr.read(65536) or b"")[-4096:]
    except (OSError, ValueError):
        return b""
