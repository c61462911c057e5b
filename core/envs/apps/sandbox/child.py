"""The sandboxed side of the apps env's ``<code>`` action. Run as a script, never imported:

    python -I -S child.py                       (stdin/stdout are pipes to the parent)

It imports nothing from the project. Protocol, one JSON object per line: the parent writes the job
``{"code", "guard", "cpu_s", "mem_mb", "max_calls", "max_output", "preload", "nofile", "root"}``
then one ``{"ok": result}`` or ``{"error": message}`` per API request; the child writes
``{"ready": true, "layers": [...]}`` once isolated (before the code runs, so the code cannot
forge it), ``{"call": name, "args": {...}}`` per API call and finally
``{"done": true, "output": printed text, "error": message or null}``. The code can reach
``os`` and write anything to the pipe: the parent checks every line (parent.py).

Isolation is applied here, after the few modules the code may use are imported and before the
untrusted code is compiled, in this order (each layer is best effort and reported in "layers"):
  netns+pidns  unshare(2) a new network namespace (no interfaces: no network) and a new pid
               namespace (the code cannot see or signal any host process); as non-root this
               needs a user namespace too. The code runs in a forked child inside them, the
               namespace's first process, which the parent kills at the end of the action.
               Under bubblewrap (which made both namespaces already, and leaves no capability
               for this) the unshare fails and the code runs in this process.
  chroot       chroot(2) into the job's empty temporary directory: no host file is reachable.
  uid/nocaps   as root: become nobody (65534), which also drops every capability; otherwise
               (or if that failed) drop every capability (capset) so chroot cannot be undone.
  rlimits      CPU seconds (SIGXCPU at the soft limit ends the job with a clear error, SIGKILL
               at the hard limit), address space (allocations raise MemoryError), FSIZE 0 (no
               file can grow), NOFILE 3 (no new descriptors), NPROC 0 (no fork), CORE 0.
  guard        restricted builtins (no open/eval/exec/getattr/type/...) and an import hook that
               only hands out public, non-module members of a few pure modules. The parent has
               already refused source that touches names or attributes starting with '_' or
               frame/code internals, so object-graph walks like ().__class__.__bases__ fail.
"""
import ctypes
import json
import os
import resource
import signal
import sys
import traceback

# Not "string": string.Formatter().get_field walks attributes by name and returns the objects.
SAFE_MODULES = ("math", "json", "re", "datetime", "collections", "itertools", "statistics",
                "functools")
for _name in SAFE_MODULES:
    __import__(_name)

_INBUF = bytearray()


def _read_line() -> dict:
    while b"\n" not in _INBUF:
        chunk = os.read(0, 65536)
        if not chunk:
            os._exit(2)  # parent went away
        _INBUF.extend(chunk)
    line, _, rest = bytes(_INBUF).partition(b"\n")
    _INBUF[:] = rest
    return json.loads(line)


def _write_line(obj) -> None:
    data = (json.dumps(obj) + "\n").encode()
    while data:
        data = data[os.write(1, data):]


# ---- isolation ---------------------------------------------------------------------------------
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000


def _isolate_namespaces(libc, layers: list) -> None:
    """New net + pid namespaces; the caller continues in a forked child inside them."""
    flags = CLONE_NEWNET | CLONE_NEWPID | (0 if os.geteuid() == 0 else CLONE_NEWUSER)
    if libc.unshare(flags) != 0:
        return
    pid = os.fork()
    if pid:  # the waiting parent: outside the pid namespace, runs no user code
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
    # If the waiting half is killed first, die too. The code could undo this, but the parent
    # kills this process itself at the end of the action, and a process orphaned before that
    # dies at its first write to the closed pipe, before any code runs.
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    layers.append("netns+pidns")


def _drop_capabilities(libc) -> bool:
    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]
    header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    return libc.capset(ctypes.byref(header), data) == 0


def isolate(job: dict, root: str) -> list:
    layers: list = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        libc = None
    was_root = os.geteuid() == 0
    if libc is not None:
        _isolate_namespaces(libc, layers)
    try:
        os.chroot(root)
        os.chdir("/")
        layers.append("chroot")
    except OSError:
        os.chdir(root)
    if was_root:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            layers.append("uid")
        except OSError:
            pass
    if "uid" not in layers and libc is not None and _drop_capabilities(libc):
        layers.append("nocaps")
    if libc is not None and libc.prctl(38, 1, 0, 0, 0) == 0:  # PR_SET_NO_NEW_PRIVS
        layers.append("no_new_privs")
    cpu = int(job["cpu_s"])
    mem, nofile = int(job["mem_mb"]) << 20, int(job.get("nofile", 3))
    limits = {"cpu": (resource.RLIMIT_CPU, (cpu, cpu + 1)),
              "core": (resource.RLIMIT_CORE, (0, 0)), "as": (resource.RLIMIT_AS, (mem, mem)),
              "fsize": (resource.RLIMIT_FSIZE, (0, 0)),
              "nofile": (resource.RLIMIT_NOFILE, (nofile, nofile)),
              "nproc": (resource.RLIMIT_NPROC, (0, 0))}
    for name, (kind, value) in limits.items():
        try:
            resource.setrlimit(kind, value)
            layers.append(f"rlimit_{name}")
        except (OSError, ValueError):
            pass
    return layers


# ---- what the code sees --------------------------------------------------------------------------
class ApiError(Exception):
    """An API call failed (bad arguments, unknown endpoint, missing record)."""


class _Output:
    def __init__(self, limit: int):
        self.parts, self.size, self.limit, self.cut = [], 0, limit, False

    def print(self, *args, sep=" ", end="\n", **_ignored):
        text = str(sep).join(str(a) for a in args) + str(end)
        room = self.limit - self.size
        if len(text) > room:
            text, self.cut = text[:max(room, 0)], True
        self.parts.append(text)
        self.size += len(text)

    def text(self) -> str:
        return "".join(self.parts) + ("\n[output truncated]" if self.cut else "")


def make_apis(max_calls: int):
    calls = [0]

    def call(name, args, kwargs):
        if args:
            raise TypeError(f"{name}: use keyword arguments, e.g. {name}(limit=5)")
        calls[0] += 1
        if calls[0] > max_calls:
            raise ApiError(f"more than {max_calls} API calls in one code action")
        try:
            request = json.dumps({"call": name, "args": kwargs})
        except (TypeError, ValueError):
            raise TypeError(f"{name}: arguments must be JSON values (str, int, float, bool, "
                            "list, dict, None)") from None
        _write_line(json.loads(request))
        reply = _read_line()
        if "error" in reply:
            raise ApiError(reply["error"])
        return reply["ok"]

    class App:
        def __init__(self, app):
            self.app = app

        def __getattr__(self, endpoint):
            return lambda *a, **k: call(f"{self.app}.{endpoint}", a, k)

    class Apis:
        def __getattr__(self, app):
            return App(app)

        def show_docs(self, *a, **k):
            return call("apis.show_docs", a, k)

    return Apis()


def safe_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name not in SAFE_MODULES:
        raise ImportError(f"module {name!r} is not available here; allowed: "
                          + ", ".join(SAFE_MODULES))
    module = sys.modules[name]
    public = {k: v for k, v in vars(module).items()
              if not k.startswith("_") and type(v) is not type(sys)}
    return type(sys.implementation)(**public)  # a SimpleNamespace copy, no module internals


SAFE_BUILTINS = (
    "abs all any bool chr dict divmod enumerate filter float format frozenset hash int isinstance "
    "issubclass iter len list map max min next ord pow range repr reversed round set slice sorted "
    "str sum tuple zip ArithmeticError AssertionError AttributeError Exception IndexError "
    "KeyError LookupError NameError NotImplementedError RuntimeError StopIteration TypeError "
    "ValueError ZeroDivisionError True False None").split()


def user_globals(guard: bool, out: _Output, apis) -> dict:
    # in the sandboxed child only, after its limits are set
    import builtins
    if guard:
        table = {k: getattr(builtins, k) for k in SAFE_BUILTINS}
        table.update(__import__=safe_import, __build_class__=builtins.__build_class__)
    else:
        table = dict(vars(builtins))
    table.update(print=out.print, ApiError=ApiError)
    return {"__builtins__": table, "__name__": "__sandbox__", "apis": apis}


def describe(exc: BaseException, mem_mb: int) -> str:
    if isinstance(exc, MemoryError):
        return f"MemoryError: memory limit of {mem_mb} MB exceeded"
    lines = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if f.filename == "<code>"]
    where = f" (line {lines[-1]})" if lines else ""
    return f"{type(exc).__name__}{where}: {exc}"[:500]


def main() -> None:
    job = _read_line()
    for name in job.get("preload", []):
        __import__(name)
    layers = isolate(job, job["root"])
    _write_line({"ready": True, "layers": layers})
    out = _Output(int(job["max_output"]))

    def on_cpu_limit(signum, frame):
        _write_line({"done": True, "output": out.text(),
                     "error": f"TimeoutError: CPU time limit of {job['cpu_s']} s exceeded"})
        os._exit(0)
    signal.signal(signal.SIGXCPU, on_cpu_limit)
    error = None
    try:
        code = compile(job["code"], "<code>", "exec")
        exec(code, user_globals(bool(job["guard"]), out, make_apis(int(job["max_calls"]))))
    except BaseException as exc:  # everything the code raises is reported, never propagated
        error = describe(exc, int(job["mem_mb"]))
    _write_line({"done": True, "output": out.text(), "error": error})
    os._exit(0)


if __name__ == "__main__":
    main()
