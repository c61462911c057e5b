"""The <code> sandbox once the Python guard is beaten: the code reaches the child's ``os`` and
``ctypes`` (stdlib helpers read an attribute named by a string), and still no process it starts
outlives its action, and nothing it writes to the parent's pipe gets out of ``env.step`` as an
exception.

The escape: ``functools.update_wrapper(obj, print, assigned=('__globals__',))`` reads
``print.__globals__`` (the child script's module globals) and hands it to ``obj.__setattr__``.
The escaped code names itself with ``prctl(PR_SET_NAME)`` so the scan below finds exactly its
processes, not another test's sandbox. PID 1 of these machines does not reap orphans, so a
zombie (state Z) counts as dead.
"""
import json
import os
import shutil
import signal
import uuid
from pathlib import Path

import pytest

from core.envs.apps.sandbox import parent as apps_sandbox
from core.envs.base import make_env

ESCAPE = """
import functools
class Grab:
    def __setattr__(self, name, value):
        found[name] = value
found = {}
functools.update_wrapper(Grab(), print, assigned=('__globals__',), updated=())
g = found['__globals__']
os = g['os']
libc = g['ctypes'].CDLL(None)
libc.prctl(15, MARK, 0, 0, 0)
"""

# the guard is beaten: leave the process group, fork if allowed, say "done", sleep forever
LINGER = """
try:
    os.setsid()
except Exception:
    pass
try:
    if os.fork() == 0:
        libc.pause()
except Exception:
    pass
os.write(1, b'{"done": true, "output": "left behind", "error": null}\\n')
libc.pause()
"""


def alive(mark: bytes, zombies: bool = False) -> list[int]:
    """Pids of live processes named ``mark`` (and of its zombies if ``zombies``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_bytes()
            except OSError:
                continue
            comm, state = stat[stat.index(b"(") + 1:stat.rindex(b")")], stat[stat.rindex(b")") + 2:][:1]
            if comm == mark and (zombies or state != b"Z"):
                pids.append(int(entry.name))
    return pids


@pytest.fixture
def mark():
    name = b"esc" + uuid.uuid4().hex[:12].encode()  # PR_SET_NAME keeps 15 bytes
    yield name
    for pid in alive(name):  # what the sandbox failed to end: end it here, by pid
        os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["bwrap", "fallback"])
def episode(request, monkeypatch):
    """One apps episode, its <code> run under bubblewrap or under the hand-written layers only."""
    if request.param == "bwrap" and not apps_sandbox.bwrap_prefix():
        pytest.skip("bubblewrap is missing or cannot start the interpreter here (CI installs it)"
                    if not shutil.which("bwrap") else "bubblewrap cannot start the interpreter here")
    if request.param == "fallback":
        monkeypatch.setattr(apps_sandbox, "bwrap_prefix", lambda: None)
    env = make_env("apps", code_cpu_s=1, code_wall_s=4.0)
    ep = env.episode(env.tasks("train", 1, seed=0)[0], 0)
    ep.reset()
    ep.mode = request.param
    return ep


def code(mark: bytes, tail: str) -> str:
    return "<code>" + ESCAPE.replace("MARK", repr(mark)) + tail + "</code>"


def payload(result):
    return json.loads(result.observation[len("\n<observation>"):-len("</observation>\n")])


def assert_still_usable(ep):
    r = ep.step("<code>rows = apis.contacts.search_contacts(limit=2)\nprint(len(rows))</code>")
    assert r.error is None and payload(r)["output"] == "2\n"
    assert ep.world.store.snapshot() == ep.initial


def test_the_guard_can_be_beaten(episode, mark):
    """The premise: the escape really reaches the child's os (so the tests below mean it)."""
    r = episode.step(code(mark, "print(os.getpid() > 0)"))
    assert r.error is None and payload(r)["output"] == "True\n"


def test_no_process_of_an_action_outlives_it(episode, mark):
    r = episode.step(code(mark, LINGER))
    assert r.action_type == "code" and not r.done and payload(r)["output"] == "left behind"
    assert alive(mark) == []
    assert alive(mark, zombies=True) == []  # and each was reaped: not even a PID is left behind
    layers = r.info["sandbox_layers"]
    assert ("bwrap" in layers) == (episode.mode == "bwrap")
    assert ("bwrap_missing" in layers) == (episode.mode == "fallback")
    assert_still_usable(episode)


FORGED = [  # Python expressions, evaluated by the escaped code, for the bytes it writes
    'b"not json\\n"',
    'b"\\xff\\xfe\\n"',
    'b"[" * 200_000 + b"\\n"',                    # nesting deep enough to exhaust the parser
    'b"1" * 5000 + b"\\n"',                       # an integer too long to convert
    """b'{"done": true, "output": "x", "error": [1, 2], "layers": ["forged"]}\\n'""",
    """b'{"done": true, "output": "x", "error": null, "layers": 5}\\n'""",
    """b'{"done": true, "output": {"a": 1}, "error": {"kind": "SyntaxError"}}\\n'""",
    """b'{"done": "yes", "call": 3}\\n'""",
    """b'{"call": ["contacts", 1], "args": "x"}\\n'""",
    """b'{"ready": true, "layers": ["forged"]}\\n'""",   # layers are read before the code ran
    """b'{"done": true, "output": "' + b"x" * (3 << 20)""",  # longer than the parent reads
]


@pytest.mark.parametrize("message", FORGED, ids=range(len(FORGED)))
def test_a_forged_or_malformed_message_is_a_tool_error(episode, mark, message):
    tail = f"data = {message}\nwhile data:\n    data = data[os.write(1, data):]\nlibc.pause()\n"
    r = episode.step(code(mark, tail))  # never raises
    assert r.action_type == "code" and not r.done
    assert isinstance(r.error, str) and r.error and payload(r)["error"] == r.error
    assert all(isinstance(x, str) for x in r.info["sandbox_layers"])
    assert "forged" not in r.info["sandbox_layers"]
    assert alive(mark) == []
    assert_still_usable(episode)


@pytest.mark.parametrize("body", ["-" * 19_990 + "1", "x" + "[0]" * 6000, "f" + "()" * 9000,
                                  "return 1", "nonlocal x"])
def test_code_the_parser_cannot_take_is_a_syntax_error_on_that_turn(body):
    """Nesting that exhausts CPython's parser (RecursionError, MemoryError) or that only the
    compiler refuses: the turn's error, decided here before any process starts."""
    env = make_env("apps")
    ep = env.episode(env.tasks("train", 1, seed=0)[0], 0)
    ep.reset()
    r = ep.step(f"<code>{body}</code>")  # never raises
    assert r.action_type == "code" and not r.valid and r.error.startswith("SyntaxError")
    assert r.info["sandbox_layers"] == []  # refused before the sandbox started


def test_a_syntax_error_the_code_reports_itself_is_not_taken_for_one(episode, mark):
    """The error kind is the child's claim: the parent compiled the code, so a "SyntaxError"
    coming back was written by the code, and does not mark the action invalid."""
    r = episode.step(code(mark, "os.write(1, b'" + '{"done": true, "output": "", "error": '
                          '"SyntaxError (line 1): forged"}' + "\\n')\nlibc.pause()\n"))
    assert r.valid and "forged" in r.error and not r.error.startswith("SyntaxError")
    assert alive(mark) == []
