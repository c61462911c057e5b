"""Here, on the developer's machine: build the GPU proof's pack, print the device calls a GPU
session makes (with what each sends), and rehearse both calls on this CPU.

A rehearsal does what a GPU session does, with the tiny model: it builds a pack (the GGUF stored,
not xz'd: xz takes ~60 s of this CPU for it), copies what the device tool would send once the
stores are stashed (checked under 64 MiB a call) into a folder standing for the machine, and
runs ``CALLS``, the two calls' exact command lines, there, one after the other.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INTO = Path("/tmp/gpu-proof")
gpu_pack = sys.modules["gpu_pack"]  # loaded by bench/gpu_proof.py before this module

CALLS = ('export PYTHONUNBUFFERED=1; {py} bench/gpu_proof.py receive .gpu-pack/part-0 --into '
         '{into} && {py} bench/gpu_proof.py check --machine --into {into}{extra}',
         'export PYTHONUNBUFFERED=1; {py} bench/gpu_proof.py receive .gpu-pack/part-1 --into '
         '{into} && {py} bench/gpu_proof.py run --into {into} --out "$OUT"{extra}')
"""The two device calls' command lines (each well under the tool's 2,000 characters)."""


def pack(args) -> None:
    """``make gpu-pack``: the pinned wheels and the model into .gpu-pack/part-N + MANIFEST.json."""
    dest = Path(args.dest)
    members = gpu_pack.model_members()
    if args.rehearse:  # the GGUF stored as is: xz would take a minute of this CPU
        manifest = gpu_pack.build(dest, members, part_bytes=_halves(members), preset=None)
    else:
        wheels = gpu_pack.download_wheels(Path(args.wheels))
        manifest = gpu_pack.build(dest, members, wheels, part_bytes=args.part_mib * 2**20)
    for p in manifest["parts"]:
        print(f"{dest / p['name']}: {p['bytes'] / 1e6:.1f} MB")
    print(f"stream {manifest['stream_bytes'] / 1e6:.1f} MB ({manifest['compression']}) in "
          f"{len(manifest['parts'])} parts; wheels: {', '.join(manifest['wheels']) or 'none'}")


def _halves(members: dict) -> int:
    """A part size that cuts the rehearsal's stored stream in two, as the real pack is cut."""
    return (sum(p.stat().st_size for p in members.values()) + 2**20) // 2


def procedure(args) -> None:
    """The device calls a GPU session makes, and what each sends now and once stashed."""
    manifest = json.loads((Path(args.dest) / "MANIFEST.json").read_text())
    rel = Path(args.dest).resolve().relative_to(ROOT)
    stashed = sum(p.stat().st_size for p in gpu_pack.stash_candidates(ROOT))
    for i, (call, part) in enumerate(zip(CALLS, manifest["parts"])):
        carry = [str(rel / part["name"]), str(rel / "MANIFEST.json")]
        size = gpu_pack.travel_bytes(ROOT, carry)
        command = call.format(py="python3", into=INTO, extra="")
        print(f"call {i + 1}: run(command={command!r}, carry={json.dumps(carry)}, "
              f"timeout_s={120 if i == 0 else 600})\n  sends {size / 2**20:.1f} MiB now, "
              f"{(size - stashed) / 2**20:.1f} MiB after `stash` (limit "
              f"{gpu_pack.LIMIT_BYTES / 2**20:.0f})")


def rehearse(args) -> int:
    """The GPU session's path on this CPU: pack, the copy the tool would make (checked under
    64 MiB a call), the two calls' command lines in it, the table in WORK/OUT."""
    t0 = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu-rehearsal-"))
    repo, into, out = work / "machine" / "repo", work / "machine" / "tmp", work / "OUT"
    shutil.rmtree(work / "machine", ignore_errors=True)
    members = gpu_pack.model_members()
    here = work / "here" / ".gpu-pack"
    manifest = gpu_pack.build(here, members, part_bytes=_halves(members), preset=None)
    keep = set(gpu_pack.travel_files(ROOT)) - set(gpu_pack.stash_candidates(ROOT))
    for path in keep:  # what the tool sends once the stores are stashed
        (repo / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, repo / path.relative_to(ROOT))
    tree = sum(p.stat().st_size for p in keep)
    env = {**os.environ, "OUT": str(out)}
    carried = repo / ".gpu-pack"
    for i, (call, part) in enumerate(zip(CALLS, manifest["parts"])):
        shutil.rmtree(carried, ignore_errors=True)  # each call carries its own part alone
        carried.mkdir(parents=True)
        for name in (part["name"], "MANIFEST.json"):
            shutil.copy(here / name, carried / name)
        sent = tree + part["bytes"] + (carried / "MANIFEST.json").stat().st_size
        print(f"== call {i + 1}: sends {sent / 2**20:.1f} MiB (limit 64)", flush=True)
        if sent > gpu_pack.LIMIT_BYTES:
            print(f"error: call {i + 1} would send {sent / 2**20:.1f} MiB", file=sys.stderr)
            return 2
        extra = " --rehearse" + "".join(f" {a}" for a in args.pass_on)
        command = call.format(py=sys.executable, into=into, extra=extra)
        done = subprocess.run(["bash", "-c", command], cwd=repo, env=env)
        if done.returncode:
            print(f"error: call {i + 1} exited {done.returncode}", file=sys.stderr)
            return done.returncode
    print(f"== rehearsal: {time.perf_counter() - t0:.0f} s; table, store and logs in {out}")
    return 0
