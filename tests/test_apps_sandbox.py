"""The apps env's <code> sandbox: escape attempts are contained, reported as errors, and the
environment stays usable after each one.

Two levels: the env's own <code> action (every layer on), and ``run_code(guard=False)``, which
runs raw Python with the source check and restricted builtins off so each kernel layer (chroot,
namespaces, rlimits) is shown to hold on its own. A kernel layer this machine cannot apply (no
root and no user namespaces) is skipped, never silently passed.
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.envs.apps.env import MAX_OBS_CHARS, tool_text
from core.envs.apps.sandbox.parent import check_source, run_code
from core.envs.base import make_env


def child_processes(settle_s: float = 2.0) -> list[int]:
    """Pids of sandbox children still alive anywhere on this machine (waiting up to settle_s
    for ones already killed to disappear)."""
    deadline = time.monotonic() + settle_s
    while (alive := _sandbox_pids()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _sandbox_pids() -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"sandbox/child.py" in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
            except OSError:
                pass
    return out


@pytest.fixture(scope="module")
def env():
    return make_env("apps", code_cpu_s=1, code_wall_s=4.0)


@pytest.fixture(scope="module")
def episode(env):
    task = env.tasks("train", 1, seed=0)[0]
    ep = env.episode(task, 0)
    ep.reset()
    return ep


def payload(result):
    text = result.observation
    return json.loads(text[len("\n<observation>"):-len("</observation>\n")])


def assert_still_usable(ep):
    """A tool call and a legitimate script both still work, and nothing changed the world."""
    before = ep.world.store.snapshot()
    r = ep.step(tool_text("contacts.search_contacts", {"limit": 1}))
    assert r.error is None and len(payload(r)) == 1
    r = ep.step("<code>rows = apis.contacts.search_contacts(limit=2)\nprint(len(rows))</code>")
    assert r.error is None and payload(r)["output"] == "2\n"
    assert ep.world.store.snapshot() == before == ep.initial


def run_in_env(ep, code):
    start = time.monotonic()
    r = ep.step(f"<code>{code}</code>")
    assert not r.done and r.action_type == "code" and r.error, code
    assert payload(r)["error"] == r.error
    return r, time.monotonic() - start


# ---- escapes through the environment's <code> action ----------------------------------------------
SECRET = "sandbox-secret-7f3a"


@pytest.mark.parametrize("code, message", [
    ("import os\nprint(os.listdir('/'))", "module 'os' is not available"),
    ("import subprocess", "module 'subprocess' is not available"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))", "module 'socket' is not"),
    ("import string", "module 'string' is not available"),
    ("from os import system", "module 'os' is not available"),
    ("import os\nwhile True:\n    os.fork()", "module 'os' is not available"),
    ("__import__('subprocess').run(['id'])", "name '__import__' is not allowed"),
    ("print(().__class__.__bases__[0].__subclasses__())", "is not allowed"),
    ("print([c for c in ().__class__.__base__.__subclasses__()])", "is not allowed"),
    ("f = lambda: 0\nprint(f.__globals__)", "'__globals__' is not allowed"),
    ("g = (x for x in [1])\nprint(g.gi_frame.f_back)", "is not allowed"),
    ("print.__self__", "'__self__' is not allowed"),
    ("print(__builtins__)", "name '__builtins__' is not allowed"),
    ("match 1:\n    case int(__class__=c):\n        print(c)", "private attributes"),
    ("import json\nprint(json.codecs)", "has no attribute 'codecs'"),
    ("print(getattr(apis, 'x'))", "name 'getattr' is not defined"),
    ("eval('1')", "name 'eval' is not defined"),
    ("exec('import os')", "name 'exec' is not defined"),
    ("print(type(1))", "name 'type' is not defined"),
    ("print(globals())", "name 'globals' is not defined"),
])
def test_python_level_escapes_are_refused_and_reported(episode, code, message):
    r, _ = run_in_env(episode, code)
    assert message in r.error
    assert_still_usable(episode)


def test_host_files_can_be_neither_read_nor_written(episode, tmp_path):
    secret, target = tmp_path / "secret.txt", tmp_path / "written.txt"
    secret.write_text(SECRET)
    for code in (f"print(open({str(secret)!r}).read())", "print(open('/etc/passwd').read())",
                 f"open({str(target)!r}, 'w').write('x')"):
        r, _ = run_in_env(episode, code)
        assert "name 'open' is not defined" in r.error
        assert SECRET not in r.observation and "root:" not in r.observation
    assert not target.exists()
    assert_still_usable(episode)


def test_an_infinite_loop_is_killed_on_time(episode):
    r, took = run_in_env(episode, "while True:\n    pass")
    assert "time limit" in r.error and took < 4.5
    r, took = run_in_env(episode, "x = 0\ntry:\n    while True:\n        x += 1\n"
                                  "except BaseException:\n    print('escaped the limit')")
    assert "time limit" in r.error and "escaped" not in payload(r)["output"] and took < 4.5
    assert_still_usable(episode)


@pytest.mark.parametrize("code", ["x = 'a' * 10**10",
                                  "x = []\nwhile True:\n    x.append(' ' * 10**6)",
                                  "x = [0] * 10**9"])
def test_huge_allocations_hit_the_memory_limit(episode, code):
    r, took = run_in_env(episode, code)
    assert "MemoryError" in r.error and "memory limit" in r.error and took < 4.5
    assert_still_usable(episode)


def test_floods_of_output_and_calls_are_capped(episode):
    r, _ = run_in_env(episode, "while True:\n    print('x' * 1000)")
    assert "time limit" in r.error and "[output truncated]" in payload(r)["output"]
    assert len(r.observation) < MAX_OBS_CHARS
    r, _ = run_in_env(episode, "for i in range(500):\n    apis.contacts.list_relationships()")
    assert "more than 100 API calls" in r.error and r.parsed["api_calls"] == 100
    assert_still_usable(episode)


def test_no_sandbox_process_outlives_its_action(episode):
    run_in_env(episode, "while True:\n    pass")
    assert child_processes() == []


# ---- the kernel layers on their own (raw Python, source check and builtins guard off) -------------
def raw(code, **kw):
    kw.setdefault("nofile", 16)  # room for sockets and files, so the layers behind it are probed
    kw.setdefault("wall_s", 4.0)
    return run_code(code, lambda name, args: (False, "no API here"), guard=False, cpu_s=1, **kw)


@pytest.fixture(scope="module")
def layers():
    result = raw("print('ok')")
    assert result.output == "ok\n", result.error
    return set(result.layers)


def namespaces_possible() -> bool:
    """Whether this machine lets a process of ours unshare a network namespace (as root, or via
    an unprivileged user namespace) — if so, the sandbox must have done it."""
    code = ("import ctypes, os; flags = 0x40000000 | (0 if os.geteuid() == 0 else 0x10000000); "
            "print(ctypes.CDLL(None).unshare(flags))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    return out.stdout.strip() == "0"


def need(layers, name):
    """Skip where the machine cannot apply layer ``name``; fail where it could but did not."""
    if name in layers:
        return
    if namespaces_possible():
        pytest.fail(f"this machine supports the {name} layer but the sandbox did not apply it")
    pytest.skip(f"this machine cannot apply the {name} layer (needs root or user namespaces)")


def test_rlimits_are_always_applied(layers):
    assert {"rlimit_cpu", "rlimit_as", "rlimit_fsize", "rlimit_nofile", "rlimit_nproc"} <= layers


def test_chroot_hides_every_host_file(layers, tmp_path):
    need(layers, "chroot")
    secret, target = tmp_path / "secret.txt", tmp_path / "written.txt"
    secret.write_text(SECRET)
    r = raw(f"import os\nprint(os.path.exists({str(secret)!r}), os.path.exists('/etc'))\n"
            f"print(open({str(secret)!r}).read())")
    assert r.output == "False False\n" and r.error and SECRET not in r.error
    r = raw(f"open({str(target)!r}, 'w').write('x')")
    assert r.error and not target.exists()


def test_a_file_cannot_be_written_even_in_the_sandbox_dir(layers):
    r = raw("f = open('here.txt', 'w')\nf.write('x' * 100)\nf.close()\nprint('wrote')")
    assert r.error and "wrote" not in r.output


def test_fork_is_refused(layers):
    need(layers, "uid" if os.geteuid() == 0 else "nocaps")  # root ignores RLIMIT_NPROC
    r = raw("import os\npid = os.fork()\nprint('forked', pid)")
    assert "BlockingIOError" in r.error and "forked" not in r.output


def test_no_network_even_to_this_machine(layers):
    need(layers, "netns+pidns")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.3)
        port = server.getsockname()[1]
        # connect() with a numeric address: no name lookup (the codecs are gone after chroot)
        r = raw(f"import socket\ns = socket.socket()\ns.settimeout(1)\n"
                f"s.connect(('127.0.0.1', {port}))\nprint('connected')", preload=("socket",))
        # no interface at all (OSError: unreachable), or, under bubblewrap, the namespace's own
        # loopback, where nothing listens (refused); either way this machine's server hears nothing
        assert r.error and ("OSError" in r.error or "ConnectionRefusedError" in r.error)
        assert "connected" not in r.output
        with pytest.raises(socket.timeout):
            server.accept()


def test_host_processes_cannot_be_signalled(layers):
    need(layers, "netns+pidns")
    r = raw(f"import os\nos.kill({os.getpid()}, 0)\nprint('reached the host process')")
    assert r.error and ("ProcessLookupError" in r.error or "PermissionError" in r.error)
    assert "reached" not in r.output


def test_raw_memory_and_cpu_limits(layers):
    assert "MemoryError" in raw("x = bytearray(10**9)").error
    start = time.monotonic()
    assert "time limit" in raw("while True:\n    pass").error
    assert time.monotonic() - start < 4.5


def test_a_child_that_blocks_or_breaks_the_protocol_is_killed(layers):
    r = raw("import os\nos.read(0, 1)", wall_s=1.0)
    assert "wall time limit of 1 s exceeded" in r.error and r.wall_s < 3
    r = raw("import os\nos.write(1, b'not json\\n')\nos.read(0, 1)")
    assert "something other than API calls" in r.error
    assert child_processes() == []


def test_the_source_check_names_the_problem():
    assert check_source("x = 1\nprint(x)") is None
    assert "SyntaxError" in check_source("def (")
    assert "line 2" in check_source("x = 1\ny = x.__class__")
    assert "too long" in check_source("x = 1\n" * 5000) or "longer" in check_source("x = 1\n" * 5000)
