"""The URL query parameters of every page, read and checked in one place.

A link is a promise about what a page will show. A parameter the page does not read (a typo:
``class=`` for ``classes=``), or a value it cannot show (a failure class the run never recorded,
a step that is not a number, a run no store holds), must not be dropped quietly: dropping a
filter shows *more* than was asked, and an export would write it. So each one is named in a
warning and the page shows the narrowest honest result -- nothing -- until the user picks
another value in the widget or removes the parameter with the warning's button. The address
keeps what the user typed meanwhile (no silent rewrite).

``PAGES`` declares each page's parameters: name -> ``Param`` (its kind; its allowed values are
given where the page knows them, e.g. the run's classes). ``parse`` and ``unknown`` are pure;
``flag``, ``flagged``, ``forget``, ``refuse`` and ``check`` keep the flags of a session.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

import streamlit as st


@dataclass(frozen=True)
class Param:
    kind: str = "text"
    """``text`` (one value), ``int`` (one integer), ``list`` (repeated: ``a=x&a=y``) or
    ``range`` (two integers ``A-B``)."""
    help: str = ""


COMMON = {"store": Param(help="the store's path"), "run": Param(help="a run id of that store"),
          "step": Param("int", "a step of the run")}
"""Read by app.py's sidebar on every page."""
STREAMLIT = {"embed", "embed_options"}
"""Streamlit's own parameters: read by its frontend, never by a page."""
PAGES: dict[str, dict[str, Param]] = {
    "runs": {},
    "replay": {"traj": Param(help="a trajectory of the step"), "turn": Param("int", "a turn"),
               "colour": Param(help="a token colouring")},
    "groups": {"group": Param(help="a group of the step")},
    "dynamics": {"spike": Param("int", "a step with a gradient norm"),
                 "curves": Param(help="all or core"),
                 "mismatch_step": Param("int", "a step with both logprobs")},
    "failures": {"classes": Param("list", "failure classes"), "splits": Param("list", "splits"),
                 "outcome": Param(help="any, solved or failed"),
                 "steps": Param("range", "a step range A-B"), "q": Param(help="search text"),
                 "tags": Param("list", "tags"), "tab": Param(help="clusters, task or sql")},
    "compare": {"a": Param(help="RUN_ID:STEP"), "b": Param(help="RUN_ID:STEP"),
                "task": Param(help="a task both evaluated")},
    "train": {},
    "glossary": {},
}
MAX_SHOWN = 80
"""Characters of a typed value repeated in a warning."""


def parse(param: Param, raw: list[str], allowed: Collection | Callable[[], Collection] | None
          = None):
    """(value, why) for the URL values ``raw`` of one parameter: ``why`` is None when every
    value can be shown, else says which cannot. A list keeps its allowed values in URL order
    and names the others; ``allowed`` (or the function giving it) is only asked when needed.

    >>> parse(Param("list"), ["wrong_answer", "repeated_action"], ["wrong_answer", "success"])
    (['wrong_answer'], 'repeated_action is not one of them')
    >>> parse(Param("int"), ["x3"])
    (None, 'x3 is not a whole number')
    >>> parse(Param("range"), ["3 - 10"])
    ((3, 10), None)
    """
    if param.kind == "list":
        values = [v for v in raw if v != ""]   # ``classes=`` alone: nothing picked
    else:
        values = raw[-1:]
    if not values:
        return (None if param.kind != "list" else []), None
    choices = allowed() if callable(allowed) else allowed
    if param.kind == "int":
        if not re.fullmatch(r"\s*-?\d{1,12}\s*", values[0]):
            return None, f"{values[0]} is not a whole number"
        value = int(values[0])
        if choices is not None and value not in choices:
            return None, f"{value} is not one of them"
        return value, None
    if param.kind == "range":
        found = re.fullmatch(r"\s*(-?\d{1,12})\s*-\s*(-?\d{1,12})\s*", values[0])
        if not found:
            return None, f"{values[0]} is not a step range A-B"
        return tuple(sorted((int(found[1]), int(found[2])))), None
    if choices is None:
        return (values if param.kind == "list" else values[0]), None
    if param.kind == "list":
        bad = [v for v in values if v not in choices]
        good = [v for v in values if v in choices]
        return good, (", ".join(bad) + (" is" if len(bad) == 1 else " are") + " not one of them"
                      if bad else None)
    return (values[0], None) if values[0] in choices else (None, f"{values[0]} is not one of them")


def unknown(names: Collection[str], page: str) -> list[str]:
    """The parameter names in ``names`` that ``page`` does not read (in their order)."""
    known = set(COMMON) | STREAMLIT | set(PAGES.get(page, {}))
    return [n for n in names if n not in known]


def escaped(text, limit: int = MAX_SHOWN) -> str:
    """Typed text for a markdown message: cut to ``limit`` characters, every ASCII punctuation
    mark backslash-escaped (CommonMark), so no link, image, HTML, emoji code or formatting."""
    text = str(text)
    cut = text[:limit] + ("…" if len(text) > limit else "")
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", cut.replace("\n", " "))


# -- a session's flags -------------------------------------------------------------------------
# {name: (raw values, why)}: a parameter whose typed value the page refused. It holds while the
# address still carries those values; the widget's on_change (forget) or new values end it.
FLAGS = "_url_refused"


def _raw(name: str) -> list[str]:
    return list(st.query_params.get_all(name))


def flag(name: str, why: str) -> None:
    """Refuse the value ``name`` has in the address now, saying ``why``."""
    st.session_state.setdefault(FLAGS, {})[name] = (_raw(name), why)


def flagged(name: str) -> bool:
    """Whether the address still holds the value of ``name`` that was refused."""
    held = st.session_state.get(FLAGS, {}).get(name)
    if held is None:
        return False
    if held[0] != _raw(name):
        st.session_state[FLAGS].pop(name, None)
        return False
    return True


def forget(name: str) -> None:
    """The user picked a value: the widget's own value replaces the refused one."""
    st.session_state.get(FLAGS, {}).pop(name, None)


def refuse(*names: str, what: str = "this view") -> None:
    """If any of ``names`` is flagged: a warning naming each, a button that removes them from
    the address, and nothing more of the page (st.stop)."""
    held = {n: st.session_state[FLAGS][n] for n in names if flagged(n)}
    if not held:
        return
    for name, (raw, why) in held.items():
        typed = "&".join(f"{name}={v}" for v in raw) or name
        st.warning(f"The address asks for **{escaped(typed)}**, which {what} cannot show: "
                   f"{escaped(why, 200)}. Nothing is shown for it, rather than more than was "
                   "asked for; pick another value or remove it.", icon="⚠️")
    if st.button("Remove " + ", ".join(escaped(n, 40) for n in held) + " from the address",
                 key="url_refused_drop"):
        for name in held:
            del st.query_params[name]
            forget(name)
        st.rerun()
    st.stop()


def check(page: str) -> None:
    """Before a page runs: every parameter name it does not read is refused (a misspelt filter
    would otherwise be a missing one), with the sidebar's own refusals (run, step)."""
    for name in unknown(list(st.query_params.keys()), page):
        if not flagged(name):
            flag(name, f"the {page} page reads no parameter of that name (it reads: "
                       + (", ".join(sorted(set(COMMON) | set(PAGES.get(page, {}))))) + ")")
    refuse(*unknown(list(st.query_params.keys()), page), *COMMON, what=f"the {page} page")
