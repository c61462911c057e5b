"""The suite's file order (tests/conftest.py): the longest files are collected first, whole and in
their own order, so `make test` (--dist loadfile --no-loadscope-reorder) never hands one out last."""
import types
from pathlib import Path

from tests import conftest

TESTS = Path(conftest.__file__).resolve().parent


def test_every_file_named_slow_exists_once():
    assert len(set(conftest.SLOW_FIRST)) == len(conftest.SLOW_FIRST)
    assert [n for n in conftest.SLOW_FIRST if not (TESTS / n).is_file()] == []


def test_slow_files_come_first_in_their_order_and_each_file_stays_whole():
    def item(rel: str, name: str):
        return types.SimpleNamespace(path=TESTS / rel, name=name)
    items = [item("test_alarms.py", "a1"), item("test_url_params.py", "u1"),
             item("test_train_cli.py", "t1"), item("test_alarms.py", "a2"),
             item("test_train_cli.py", "t2"), item("reliability/test_kill.py", "k1"),
             item("test_pages.py", "p1"), item("test_pages.py", "p2"),
             types.SimpleNamespace(path=Path("/elsewhere/test_x.py"), name="x1")]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.name for i in items] == ["p1", "p2", "t1", "t2", "k1", "a1", "u1", "a2", "x1"]
