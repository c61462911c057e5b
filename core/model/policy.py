"""The policy: a causal LM with LoRA adapters, its tokenizer, and token logprobs.

Models (``--model``: tiny, smollm2-135m, a local directory or GGUF file) are loaded by
core/model/models.py, whose names are re-exported here; nothing is ever downloaded. docs/models.md
has the details.

The device (``--device``, core/model/device.py): the base network, the LoRA adapters and the value head
live on ``policy.device``; so do the KV cache and the rollout's tensors (core/rollout/engine.py).
``token_logprobs`` takes its inputs from anywhere and returns its results on the inputs' device,
so the loss and the recorded numbers are computed in fp32 by the same code on CPU and GPU. On
CUDA the network runs under bf16 autocast; the vocabulary projection the logprobs come from runs
in fp32.

LoRA targets ``all-linear`` (the default) resolve to every linear layer of the base network but
its output head (core/model/models.py ``linear_targets``); the resolved names are recorded.

The reference policy for the KL penalty (``policy.reference()``) is the policy at the start of
RL: ``freeze_reference`` copies the trained adapter, after the SFT warm start, into a second,
frozen LoRA adapter beside it (the base weights are shared, never copied). Without that copy
(``kl_reference=base``) the reference is the base model: the same network, adapters switched off.

The network stays in eval mode; only the update's forward and backward switch LoRA's dropout on
(``policy.dropout()``), so sampling and every scoring pass are deterministic.

Logprobs are computed only at scored positions (the model's own tokens), in chunks of rows of the
(N, vocab) logits under activation checkpointing, so the 49k-wide logits of a whole batch never
exist at once, in the forward pass or the backward pass.

Each token's text for the record (``token_texts``) lives in storage/token_text.py, re-exported here.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from core.model import device as devices
from core.algorithms.catalog import resolve
from core.model.models import (  # noqa: F401 (re-exported: the loaders' names callers use)
    ALL_LINEAR, CACHE_NAME, GGUF_FILE, INSTALL_HINT, MODEL_PACKAGE, TINY, ModelNotAvailable,
    _fixed_seed, cache_root, gguf_dir, is_gguf, linear_targets, load_base_model, load_tokenizer)
from storage.token_text import token_texts  # noqa: F401 (re-exported)

REFERENCE = "reference"
"""Name of the frozen adapter that is the KL reference (``Policy.freeze_reference``)."""
LOGIT_CHUNK = 512
"""Rows of (rows, vocab) logits computed at once: 512 x 49152 fp32 is ~100 MB."""


# -- the policy -----------------------------------------------------------------------------------
@dataclass
class Policy:
    model: nn.Module
    """A peft PeftModel: the frozen base plus trainable LoRA adapters."""
    tokenizer: object
    name: str
    value_head: nn.Module | None = None
    """PPO's critic: a linear map of the last hidden state to a scalar (None for other algos)."""
    lora_target_modules: list[str] | None = None
    """The module names LoRA wrapped (``all-linear`` resolved), recorded in the run's config."""

    def resolved(self) -> dict:
        """What the run's config records beside the fields it was given: the device, the prompt
        format and the LoRA target modules as this model resolved them."""
        return {"device_resolved": devices.name(self.device), "prompt_format": self.prompt_format,
                "lora_target_modules": list(self.lora_target_modules or [])}

    @property
    def base(self) -> nn.Module:
        return self.model.get_base_model()

    @property
    def device(self) -> torch.device:
        """Where the network's weights are (and its inputs must go)."""
        return next(self.model.parameters()).device

    @property
    def prompt_format(self) -> str:
        """``chat_template``: prompts and user-turn observations rendered by the tokenizer's own
        template; ``raw``: the tokenizer has none, so texts are joined with blank lines
        (core/rollout/transcript.py). Recorded in the run's config."""
        return "chat_template" if getattr(self.tokenizer, "chat_template", None) else "raw"

    def autocast(self):
        """bf16 autocast on CUDA, nothing on the CPU (core/model/device.py)."""
        return devices.autocast(self.device)

    def to(self, device: torch.device) -> "Policy":
        """Move the network, its adapters and the value head to ``device``."""
        self.model.to(device)
        if self.value_head is not None:
            self.value_head.to(device)
        return self

    @property
    def backbone(self) -> nn.Module:
        """The decoder stack without the LM head (LoRA layers are injected in place)."""
        return getattr(self.base, self.base.base_model_prefix)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id

    @property
    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id}
        gen = getattr(self.base, "generation_config", None)
        extra = getattr(gen, "eos_token_id", None) if gen is not None else None
        ids.update(extra if isinstance(extra, (list, tuple)) else [extra])
        return {i for i in ids if i is not None}

    def reference(self):
        """Context manager: inside it the network is the KL reference policy: the frozen adapter
        (``freeze_reference``) if there is one, else the base model (adapters off)."""
        if self.has_reference:
            return self._frozen_reference()
        return self.model.disable_adapter()

    @property
    def has_reference(self) -> bool:
        return REFERENCE in self.model.peft_config

    @contextlib.contextmanager
    def _frozen_reference(self) -> Iterator[None]:
        trained = self.model.active_adapter
        # inference_mode: peft would otherwise make the activated adapter trainable
        self.model.set_adapter(REFERENCE, inference_mode=True)
        try:
            yield
        finally:  # back to the trained adapter, trainable again; the reference frozen
            self.model.set_adapter(trained)

    def freeze_reference(self, state: dict | None = None) -> None:
        """Make the KL reference a frozen copy of the trained adapter as it is now (or the saved
        reference adapter ``state``, from ``reference_state``, on resume): a second LoRA adapter
        that is never trained. Calling it again replaces the copy."""
        # deferred: peft and transformers take seconds to import; only building a model needs them
        from peft import get_peft_model_state_dict, set_peft_model_state_dict
        if state is None:
            state = get_peft_model_state_dict(self.model, save_embedding_layers=False)
        if not self.has_reference:
            config = copy.deepcopy(self.model.peft_config[self.model.active_adapter])
            config.inference_mode = True  # added frozen
            # the new adapter is initialised randomly (then overwritten): keep the global RNG
            # where it was, so dropout masks and anything else seeded stay as without it
            with _fixed_seed(0), warnings.catch_warnings():
                # peft repeats its load-time note on an lm_head adapter tied to the embeddings;
                # the copy is never merged or exported, so it adds nothing
                warnings.filterwarnings("ignore", message=".*tied layer is part of the adapter.*")
                self.model.add_adapter(REFERENCE, config)
            self.model.eval()  # the new dropout layers are created in training mode
        result = set_peft_model_state_dict(self.model, state, adapter_name=REFERENCE)
        unexpected = list(getattr(result, "unexpected_keys", []))
        if unexpected:
            raise RuntimeError(f"reference adapter does not fit the model: {unexpected[:3]}")

    def reference_state(self) -> dict | None:
        """The frozen reference adapter's weights (for checkpoints), None without one."""
        if not self.has_reference:
            return None
        # deferred: peft and transformers take seconds to import; only building a model needs them
        from peft import get_peft_model_state_dict
        return get_peft_model_state_dict(self.model, adapter_name=REFERENCE,
                                         save_embedding_layers=False)

    @contextlib.contextmanager
    def dropout(self, seed: int = 0) -> Iterator[None]:
        """Context manager for an update's forward and backward: the trained adapter's LoRA
        dropout layers in training mode, their masks drawn from ``seed`` (the global RNG is put
        back afterwards). Only LoRA's dropout: the frozen base network's own dropout, if its
        config has any, stays off, as ``lora_dropout`` is all the config asks for."""
        name = f".lora_dropout.{self.model.active_adapter}"
        layers = [m for n, m in self.model.named_modules()
                  if n.endswith(name) and isinstance(m, nn.Dropout)]
        if not layers:  # lora_dropout = 0: peft put identities there
            yield
            return
        # the masks are drawn on the adapters' device: fork (and restore) that device's RNG
        here = self.device
        with torch.random.fork_rng(devices=[here] if here.type == "cuda" else []):
            torch.manual_seed(seed)
            for m in layers:
                m.train()
            try:
                yield
            finally:
                for m in layers:
                    m.eval()

    @contextlib.contextmanager
    def merged(self) -> Iterator[None]:
        """Context manager for sampling: each LoRA layer of the active adapter is replaced by one
        plain layer whose weight is ``W + scaling * B @ A``, computed once on entry, so a forward
        pass is one product a layer instead of three (and none of peft's per-call bookkeeping).
        ``merge_adapter()``'s speed, as verl syncs the trained weights into vLLM for its rollouts.

        Exact on the way out: the merged weights are new tensors and the LoRA layers are put back
        as they were, even when the body raises, so the frozen base weights never take the
        rounding of an add and a subtract (peft's ``unmerge_adapter``) and stay bit-identical.
        A tied output head merged this way does not change the input embeddings.

        Inside, the network's float math differs slightly from the unmerged forward the update
        scores with (another order of sums). That is the training-inference mismatch a real
        engine has too: the sampler's logprobs and the trainer's are both recorded, and their
        difference is what the run shows (``mismatch/*``, core/learn/mismatch.py). Costs one
        copy of the wrapped layers' weights while inside. Layers it cannot merge exactly
        (adapters switched off, a LoRA variant such as DoRA, a LoRA bias, dropout in training
        mode) stay as they are."""
        swapped = []
        try:
            with torch.no_grad():
                for parent, child, layer in _mergeable(self.model):
                    setattr(parent, child, _merged_copy(layer))
                    swapped.append((parent, child, layer))
            yield
        finally:
            for parent, child, layer in reversed(swapped):
                setattr(parent, child, layer)

    def trainable_parameters(self) -> list[nn.Parameter]:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.value_head is not None:
            params += list(self.value_head.parameters())
        return params

    def lora_modules(self) -> dict[str, list[nn.Parameter]]:
        """LoRA parameters grouped by the wrapped module's name (for per-module grad norms)."""
        groups: dict[str, list[nn.Parameter]] = {}
        for name, p in self.model.named_parameters():
            if p.requires_grad and ".lora_" in name:
                module = name.split(".lora_")[0].removeprefix("base_model.model.")
                groups.setdefault(module, []).append(p)
        return groups




def _mergeable(model: nn.Module) -> list[tuple[nn.Module, str, nn.Module]]:
    """(parent, attribute name, layer) of every peft LoRA linear layer whose forward is exactly
    ``base(x) + sum over active adapters of scaling * B(A(x))`` (``Policy.merged``)."""
    # deferred: peft takes seconds to import; only a built policy needs it
    from peft.tuners.lora.layer import Linear as LoraLinear
    found = []
    for parent in model.modules():
        for child, layer in parent.named_children():
            if type(layer) is not LoraLinear or layer.disable_adapters or layer.merged:
                continue
            names = [a for a in layer.active_adapters if a in layer.lora_A]
            if any(a in layer.lora_variant or layer.lora_bias.get(a)
                   or (layer.lora_dropout[a].training and not isinstance(
                       layer.lora_dropout[a], nn.Identity) and layer.lora_dropout[a].p > 0)
                   for a in names):
                continue
            found.append((parent, child, layer))
    return found


def _merged_copy(layer: nn.Module) -> nn.Module:
    """The LoRA layer's base layer with its weight replaced by a merged copy (the base layer
    itself is untouched: the copy has its own parameter dict)."""
    base = layer.get_base_layer()
    weight = base.weight.detach().clone()
    for name in layer.active_adapters:
        if name in layer.lora_A:
            weight += layer.get_delta_weight(name).to(weight.dtype)
    merged = copy.copy(base)
    merged._parameters = dict(base._parameters)
    merged._parameters["weight"] = nn.Parameter(weight, requires_grad=False)
    return merged


def load_policy(model: str = "tiny", *, lora_rank: int = 16, lora_alpha: int = 32,
                lora_dropout: float = 0.0, lora_targets: str = ALL_LINEAR,
                value_head: bool = False, seed: int = 0,
                device: torch.device | str = "cpu") -> Policy:
    """Base model + tokenizer + fresh LoRA adapters (initialised from ``seed``) on ``device``.
    ``lora_targets``: comma-separated module names or ``all-linear`` (``linear_targets``)."""
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from peft import LoraConfig, get_peft_model
    tokenizer = load_tokenizer(model)
    base = load_base_model(model, vocab_size=len(tokenizer))
    if lora_targets.strip() == ALL_LINEAR:
        targets = linear_targets(base)
    else:
        targets = [t.strip() for t in lora_targets.split(",") if t.strip()]
    present = {name.rsplit(".", 1)[-1] for name, _ in base.named_modules()}
    missing = [t for t in targets if t not in present]
    if missing or not targets:
        raise ValueError(f"lora_targets: modules {missing} not found in model {model!r}; it has "
                         f"these linear layers: {', '.join(linear_targets(base))} "
                         f"(or use {ALL_LINEAR})")
    # deferred: peft and transformers take seconds to import; only building a model needs them
    from transformers.pytorch_utils import Conv1D
    wrapped = [m for n, m in base.named_modules() if n.rsplit(".", 1)[-1] in targets]
    # GPT-2's Conv1D keeps its weight transposed (in, out): LoRA must know (peft would else
    # switch it on with a warning per run)
    transposed = bool(wrapped) and all(isinstance(m, Conv1D) for m in wrapped)
    lora = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                      target_modules=targets, bias="none", task_type="CAUSAL_LM",
                      fan_in_fan_out=transposed)
    with _fixed_seed(seed), warnings.catch_warnings():
        # peft still calls a transformers property deprecated in favour of a new name
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        # LoRA on lm_head of a model with tied embeddings (the tiny model, SmolLM2): peft warns
        # that merging such an adapter, or converting the model, would change the input
        # embeddings too. Harmless here: the adapter is never merged in place (``merged`` swaps
        # in merged copies; checkpoints keep the adapter alone), and the warning, long and with
        # a URL, opened every job log on the Train page like an error (issue 51).
        warnings.filterwarnings("ignore", message=".*tied layer is part of the adapter.*")
        peft_model = get_peft_model(base, lora)
        head = nn.Linear(base.config.hidden_size, 1) if value_head else None
    if head is not None:
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
    peft_model.eval()
    policy = Policy(model=peft_model, tokenizer=tokenizer, name=model, value_head=head,
                    lora_target_modules=targets)
    return policy.to(torch.device(device))


def policy_from_config(cfg, device: torch.device | str = "cpu",
                       value_head: bool | None = None) -> Policy:
    """The run's policy; ``value_head`` from the run's resolved algorithm (core/run/steps.py
    ``build``), or, for a job given none, from ``cfg.algo``."""
    if value_head is None:
        value_head = resolve(cfg.algo).needs_value_head
    return load_policy(cfg.model, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                       lora_dropout=cfg.lora_dropout, lora_targets=cfg.lora_targets,
                       value_head=value_head, seed=cfg.seed, device=device)


# -- logprobs -------------------------------------------------------------------------------------
def _chunk_scores(lm_head: nn.Module, hidden: torch.Tensor, targets: torch.Tensor,
                  temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """log pi(target | h) and the entropy of pi(. | h) for rows of hidden states (N, H)."""
    with devices.full_precision(hidden.device):               # fp32 logits, even under autocast
        logits = lm_head(hidden.float()).float() / temperature  # (N, V)
    lse = torch.logsumexp(logits, dim=-1)                      # (N,)
    logprob = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    with torch.no_grad():
        probs = torch.softmax(logits, dim=-1)
        entropy = lse - (probs * logits).sum(-1)
    return logprob, entropy


def token_logprobs(policy: Policy, input_ids: torch.Tensor, score_mask: torch.Tensor, *,
                   attention_mask: torch.Tensor | None = None, temperature: float = 1.0,
                   with_values: bool = False, chunk: int = LOGIT_CHUNK,
                   position_ids: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-token scores of ``input_ids`` (B, T) at the positions where ``score_mask`` (B, T) is True.

    Returns (B, T) float tensors, zero where not scored:
      ``logprobs[b, t] = log softmax(logits(ids[b, :t]) / temperature)[ids[b, t]]``,
      ``entropy`` (detached), and with ``with_values`` the value head's ``V(ids[b, :t])``.
    Position 0 is never scored (nothing precedes it). Gradients flow when grad is enabled.
    ``attention_mask`` is (B, T) padding, or with ``position_ids`` a custom (B, 1, T, T) mask
    (several contexts packed in one row, core/credit/info_gain.py ``pack``); token t is still scored
    from position t-1's hidden state.
    The network runs on ``policy.device`` (bf16 autocast on CUDA, fp32 logits); the results come
    back on ``input_ids``' device, as fp32.
    """
    home = input_ids.device
    dev = policy.device
    input_ids, score_mask = input_ids.to(dev), score_mask.to(dev)
    B, T = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    attention_mask = attention_mask.to(dev)
    if position_ids is None:
        if attention_mask.dim() != 2:
            raise ValueError("a custom (B, 1, T, T) attention mask needs its position_ids")
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    position_ids = position_ids.to(dev)
    with policy.autocast():
        hidden = policy.backbone(input_ids=input_ids, attention_mask=attention_mask,
                                 position_ids=position_ids, use_cache=False).last_hidden_state
    score = score_mask.bool().clone()
    score[:, 0] = False
    where = score[:, 1:]                                       # (B, T-1): predict token t from t-1
    h = hidden[:, :-1][where]                                  # (N, H)
    targets = input_ids[:, 1:][where]                          # (N,)
    lm_head = policy.base.get_output_embeddings()
    lps, ents = [], []
    for start in range(0, h.shape[0], chunk):
        hc, tc = h[start:start + chunk], targets[start:start + chunk]
        if torch.is_grad_enabled():
            # Recompute the chunk's logits in backward instead of keeping (N, V) of them alive.
            lp, ent = checkpoint(_chunk_scores, lm_head, hc, tc, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_scores(lm_head, hc, tc, temperature)
        lps.append(lp)
        ents.append(ent)
    out = {"logprobs": _scatter(lps, score, hidden), "entropy": _scatter(ents, score, hidden).detach()}
    if with_values:
        if policy.value_head is None:
            raise ValueError("with_values needs a policy built with a value head (an algorithm "
                             "with needs_value_head, e.g. ppo)")
        with devices.full_precision(dev):  # the critic's value enters the loss: fp32
            values = policy.value_head(h.float()).squeeze(-1)
        out["values"] = _scatter([values], score, hidden)
    return {k: v.to(home) for k, v in out.items()}


def _scatter(parts: list[torch.Tensor], score: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Put packed per-position values (N,) back at the True positions of ``score`` (B, T)."""
    flat = torch.cat(parts) if parts else like.new_zeros(0)
    out = like.new_zeros(score.shape, dtype=torch.float32)
    return out.masked_scatter(score, flat.float()) if flat.numel() else out
