"""The faces of core's heavy packages: each package's ``__init__`` names what other packages use
(its ``__all__``) and loads each name's module on first use (PEP 562), so importing one light
module of a package (a dataclass, a pure function) does not load torch with its siblings."""
from __future__ import annotations

import importlib
from typing import Callable


def lazy_face(package: str, exports: dict[str, str | tuple[str, str]]
              ) -> tuple[Callable[[str], object], list[str]]:
    """``(__getattr__, __all__)`` for ``package``: ``exports`` maps each public name to the
    module defining it, or to ``(module, name there)`` when the face renames it."""
    where = {name: (v, name) if isinstance(v, str) else v for name, v in exports.items()}

    def __getattr__(name: str):
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attr = where[name]
        return getattr(importlib.import_module(module), attr)
    return __getattr__, sorted(where)
