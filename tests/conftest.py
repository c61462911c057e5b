import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a torch-heavy test module: on a shared 2-core machine,
    oversubscribed threads run many times slower. Modules opt in with
    ``pytestmark = pytest.mark.usefixtures("one_torch_thread")``."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", autouse=True)
def one_component_scan_per_process():
    """Every AppTest shares one component registry, as a served app's sessions share its
    runtime's. Streamlit's AppTest (1.67) makes a registry per AppTest and fills it by reading
    the metadata of every installed distribution (500+ packages here): the suite's ~1,000
    AppTests paid that scan each (tests/test_pages.py alone 160.8 -> 106.5 s without it). A
    served app scans once at startup (streamlit/runtime/runtime.py), and so do the tests now."""
    from streamlit.components.v2.component_manager import BidiComponentManager
    from streamlit.testing.v1 import AppTest
    made = AppTest.__init__
    shared: list[BidiComponentManager] = []

    def init(self, *args, **kwargs):
        made(self, *args, **kwargs)
        # a Streamlit whose AppTest keeps no such attribute, or fills it itself, would scan per
        # AppTest again
        assert getattr(self, "_bidi_component_manager", False) is None, \
            "Streamlit's AppTest changed"
        if not shared:
            shared.append(BidiComponentManager())
            shared[0].discover_and_register_components(start_file_watching=False)
        self._bidi_component_manager = shared[0]
    AppTest.__init__ = init
    yield
    AppTest.__init__ = made


@pytest.fixture(scope="session", autouse=True)
def one_compile_per_script():
    """Every AppTest shares the compiled scripts, as a served app's sessions share its runtime's
    script cache. AppTest (1.67) makes a new cache per run, so app.py and the page were read,
    rewritten for Streamlit's magic and compiled again on every run (~14% of a page's run
    here). A script is compiled again when its size or modification time changes."""
    from streamlit.runtime.scriptrunner.script_cache import ScriptCache
    from streamlit.testing.v1 import app_test, local_script_runner
    compiled: dict = {}

    class Compiled(ScriptCache):
        def get_bytecode(self, script_path: str):
            path = os.path.abspath(script_path)
            stat = os.stat(path)
            key = (path, stat.st_mtime_ns, stat.st_size)
            if key not in compiled:
                compiled[key] = ScriptCache().get_bytecode(path)
            return compiled[key]

    modules = (app_test, local_script_runner)
    assert all(getattr(m, "ScriptCache", None) is ScriptCache for m in modules), \
        "Streamlit's AppTest changed"
    for m in modules:
        m.ScriptCache = Compiled
    yield
    for m in modules:
        m.ScriptCache = ScriptCache


# The longest test files, roughly longest first. `make test` hands whole files to its workers in
# the order collected (Makefile: --dist loadfile --no-loadscope-reorder): a long file handed out
# last runs alone at the end while the other worker idles (pytest-xdist's own order, most tests
# first, put the one-test browser and training files there), so these are collected first and
# the short files fill in around them (ordered by each file's seconds in one run of them in a
# row, the browser files by their number of tests). The files not named keep their usual order
# after these.
SLOW_FIRST = (
    "test_pages.py",                        # AppTest: every page of every sample run
    "test_browser.py",                      # served app + Chromium, and a training job
    "test_browser_clarity.py",              # served app + Chromium, and a training job
    "test_init_from.py",                    # trainings started from other runs' checkpoints
    "test_train_cli.py",                    # python -m core.train: runs, Ctrl-C, kill, resume
    "test_browser_failures_filters.py",
    "test_browser_first_minute.py",
    "test_learning.py",                     # the workshop demo's SFT + RL, to a learning margin
    "test_browser_dynamics.py",
    "reliability/test_faults.py",
    "test_trl_callback.py",                 # TRL GRPO trainings
    "test_browser_failures.py",
    "reliability/test_kill.py",
    "reliability/test_concurrency.py",
    "test_distributed.py",
    "test_follow_inspect.py",
    "test_cross_eval.py",
    "test_browser_trl.py",
    "test_browser_runs.py",
    "test_browser_replay_pictures.py",
    "test_browser_inspect.py",
    "test_browser_glossary.py",
    "test_init_from_ppo.py",
    "test_browser_url_params.py",
    "test_browser_compare_imports.py",
    "test_browser_replay_sokoban.py",
    "test_browser_otlp_live.py",
    "test_browser_branch_live.py",
    "test_browser_behaviours.py",
    "test_follow.py",
    "test_trainer.py",
    "test_follow_identity.py",
    "reliability/test_security.py",
    "test_follow_bounds.py",
    "test_live_reading.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    tests = ROOT / "tests"

    def module_rank(item) -> int:
        try:
            return rank.get(item.path.relative_to(tests).as_posix(), len(rank))
        except ValueError:      # a test file outside tests/, named on the command line
            return len(rank)
    items.sort(key=module_rank)    # stable: a file's tests stay together and in their order
