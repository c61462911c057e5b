"""Environment options, declared once by each environment: a class attribute

    OPTIONS = {"code_mem_mb": Option(int, 64, 1024, default=256, doc="..."), ...}

whose constructor takes them with ``take_options`` (``__init__(self, seed=0, topk=3,
**options)``), so the same declaration builds the environment, checks a configuration before a
run starts (core/config/env_options.py, core/config/validation.py) and documents the options (the Train form's
help). Imports nothing: pages and validation read declarations without torch.

Why every option is declared and checked, none swallowed: an option can lift a limit the
environment enforces (the apps ``<code>`` sandbox's memory and time), so an unknown name or a
value outside its bounds is refused by name, never ignored and never passed on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


class OptionError(ValueError):
    """An environment option that is unknown, of the wrong type or outside its bounds."""


@dataclass(frozen=True)
class Option:
    type: type | tuple[type, ...]
    """int, float, bool or str; a tuple accepts any of them (the first names the kind)."""
    low: float | None = None
    """Smallest allowed value (inclusive), None for no bound."""
    high: float | None = None
    """Largest allowed value (inclusive), None for no bound."""
    default: Any = None
    doc: str = ""
    choices: tuple = ()
    """When not empty, the only values allowed."""

    def kind(self) -> str:
        """'an integer', 'a number', 'true or false', 'text'."""
        first = self.type[0] if isinstance(self.type, tuple) else self.type
        return {int: "an integer", float: "a number", bool: "true or false", str: "text"}.get(
            first, first.__name__)

    def describe(self) -> str:
        """'an integer in 64..1024, default 256' and the like, for errors and help texts."""
        text = self.kind()
        if self.choices:
            text += f", one of {', '.join(map(str, self.choices))}"
        if self.low is not None or self.high is not None:
            text += f" in {_num(self.low, '-inf')}..{_num(self.high, 'inf')}"
        return text + (f", default {self.default}" if self.default is not None else "")

    def check(self, name: str, value: Any) -> Any:
        """``value`` as the option's type, or OptionError naming the option, the value and the
        allowed range. bool is never taken for a number (True is an int in Python) and an int is
        taken for a float, so ``slip=0`` means 0.0."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        numeric = not isinstance(value, bool) and isinstance(value, (int, float))
        if float in types and numeric:
            ok, cast = math.isfinite(value), float(value)
        elif int in types:
            ok, cast = numeric and isinstance(value, int), value
        else:
            ok = isinstance(value, types) and (bool in types or not isinstance(value, bool))
            cast = value
        ok = ok and (self.low is None or cast >= self.low) and (
            self.high is None or cast <= self.high) and (not self.choices or cast in self.choices)
        if not ok:
            expected = self.describe().split(", default")[0]
            raise OptionError(f"{name}={value!r}: must be {expected}"
                              + (f" ({self.doc})" if self.doc else ""))
        return cast


def _num(bound: float | None, none: str) -> str:
    """A bound as written: whole numbers in full (1000000, not 1e+06)."""
    if bound is None:
        return none
    return str(int(bound)) if float(bound).is_integer() and abs(bound) < 1e15 else f"{bound:g}"


def take_options(env: str, declared: Mapping[str, Option], given: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """Every declared option's value: ``given``'s, checked, else its default. OptionError for a
    name ``declared`` lacks (listing the known ones) or naming every bad value, in the order
    given (``Option.check``)."""
    unknown = [name for name in given if name not in declared]
    if unknown:
        raise OptionError(f"unknown option(s) {', '.join(unknown)} for env {env}; known: "
                          f"{', '.join(declared) or 'none'}")
    values, bad = {}, []
    for name, value in given.items():
        try:
            values[name] = declared[name].check(name, value)
        except OptionError as exc:
            bad.append(str(exc))
    if bad:
        raise OptionError("; ".join(bad))
    return {name: values.get(name, opt.default) for name, opt in declared.items()}
