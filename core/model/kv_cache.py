"""The rollout's batch of rows and their shared KV cache (core/rollout/engine.py, core/rollout/continuation.py).

Each layer's keys and values live in one buffer (rows, heads, room, head_dim) that a forward pass
writes into in place, with room to grow. transformers' DynamicCache concatenates each step's keys
onto the whole cache instead (``torch.cat``): a decode step then copies every cached token of
every row, for SmolLM2 at 32 rows x 300 tokens about 440 MB a step.

Rows that finished their turn early leave the computation, not the cache: the rows still
generating are kept in a prefix [0, n) of the buffers (``park`` swaps a finished row behind
them), so a decode step runs the network on n rows only and reads the cache as a view. The
parked rows' new columns stay zero, masked out; at the turn's end ``keep`` puts the rows back in
batch order (and drops those whose episode ended) before they all feed their observations.

Rows whose first chunk is the same token list (the G rollouts of one task share their prompt; a
branch job's K continuations of one turn share their history) are encoded once and their cache
copied. Rows never mix: attention reads a row's own columns, and masked columns add exact zeros.
What a row computes is therefore what it computed when every row was fed every step, up to the
rounding of a matrix product with fewer rows (the shared prompt: logprobs ~1e-5 apart on
SmolLM2, bench/README.md "Rollout").
"""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from core.model.device import full_precision, rollout_autocast

_ROOM = 128
"""Columns added beyond what a growth needs (and at least a quarter more): growing copies the
whole cache, so it should be rare."""


def _grown(buf: torch.Tensor, dim: int, need: int) -> torch.Tensor:
    """``buf`` with at least ``need`` entries along ``dim``; new entries are zero."""
    have = buf.shape[dim]
    if have >= need:
        return buf
    shape = list(buf.shape)
    shape[dim] = need + max(_ROOM, need // 4)
    out = buf.new_zeros(shape)
    out.narrow(dim, 0, have).copy_(buf)
    return out


class _Layer(DynamicLayer):
    """One layer's cache: writes into a buffer with room instead of concatenating. A forward pass
    over n rows writes rows [0, n) of the next columns and reads rows [0, n) back as a view."""

    def __init__(self):
        super().__init__()
        self.length = 0
        self.kbuf = self.vbuf = None

    def update(self, key_states, value_states, *args, **kwargs):
        n, end = key_states.shape[0], self.length + key_states.shape[-2]
        if self.kbuf is None:
            self.is_initialized, self.device = True, key_states.device
            self.kbuf = key_states.new_zeros(n, key_states.shape[1], 0, key_states.shape[-1])
            self.vbuf = value_states.new_zeros(n, value_states.shape[1], 0, value_states.shape[-1])
        self.kbuf, self.vbuf = _grown(self.kbuf, 2, end), _grown(self.vbuf, 2, end)
        self.kbuf[:n, :, self.length:end] = key_states
        self.vbuf[:n, :, self.length:end] = value_states
        self.length = end
        self.keys, self.values = self.kbuf[:n, :, :end], self.vbuf[:n, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows ``index`` (in that order; an index may repeat)."""
        if self.kbuf is not None:
            self.kbuf, self.vbuf = self.kbuf[index], self.vbuf[index]

    def move(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Rows ``dst`` become copies of rows ``src`` as they were (the right side is gathered
        before anything is written)."""
        if self.kbuf is not None:
            self.kbuf[dst] = self.kbuf[src]
            self.vbuf[dst] = self.vbuf[src]


class Batch:
    """The rows of a rollout that share one KV cache, their attention mask and their positions.

    ``rows`` are in batch order (the order random draws are made in, core/rollout/engine.py); each row
    has ``fed`` (real tokens in the cache: the next position id). ``order`` is the batch index of
    each row of the cache; the first ``n`` are live (a decode step computes them). After ``keep``
    every row is live, in batch order.
    """

    def __init__(self, policy, rows: list, precision: str = "auto"):
        self.policy, self.rows, self.precision = policy, rows, precision
        """``precision``: the sampling pass's (core/model/device.py ``rollout_autocast``)."""
        self.device = policy.device  # the mask, the fed ids and the KV cache live there
        self.cache = Cache(layer_class_to_replicate=_Layer)
        self.mask = torch.zeros(len(rows), 0, dtype=torch.long, device=self.device)
        self.width = 0
        """Columns in the cache (real tokens and holes) of every row."""
        self.order, self.n = list(range(len(rows))), len(rows)

    @property
    def live(self) -> list[int]:
        """Batch indices of the live rows, in cache order."""
        return self.order[:self.n]

    def feed(self, chunks: list[list[int]]) -> torch.Tensor:
        """Append each row's chunk (left-padded: the pads are holes in the mask; position ids count
        real tokens only); return the logits (rows, V) after each row's last token. Every row
        takes part (call it after ``keep``)."""
        assert self.n == len(self.order) == len(self.rows), "feed after keep: every row live"
        if self.width == 0:  # rows with the same first chunk are encoded once
            first: dict[tuple, int] = {}
            same = [first.setdefault(tuple(c), len(first)) for c in chunks]
            if len(first) < len(chunks):
                unique = [list(c) for c in first]
                firsts = [same.index(u) for u in range(len(unique))]
                fed = [self.rows[i].fed for i in firsts]
                logits = self._forward(unique, fed)
                index = torch.tensor(same, device=self.device)
                for layer in self.cache.layers:
                    layer.select(index)
                self.mask = self.mask[index]
                for row, c in zip(self.rows, chunks):
                    row.fed += len(c)
                return logits[index]
        logits = self._forward(chunks, [row.fed for row in self.rows])
        for row, c in zip(self.rows, chunks):
            row.fed += len(c)
        return logits

    def step(self, tokens: list[int]) -> torch.Tensor:
        """Feed one token to each live row (in ``live`` order); return their logits (n, V)."""
        rows = [self.rows[b] for b in self.live]
        logits = self._forward([[t] for t in tokens], [row.fed for row in rows])
        for row in rows:
            row.fed += 1
        return logits

    def park(self, positions: list[int]) -> list[int]:
        """Take the live rows at these positions of ``live`` out of the computation (their turn
        ended): each is swapped with the last live row. Returns the rows still live."""
        n, src = self.n, list(range(self.n))  # src[i]: the cache row that moves to row i
        # from the highest position down: the last live slot is then either p itself or a row that
        # stays live (any parked row above p has already been moved behind it)
        for p in sorted(positions, reverse=True):
            n -= 1
            src[p], src[n] = src[n], src[p]
            self.order[p], self.order[n] = self.order[n], self.order[p]
        moved = [i for i, j in enumerate(src) if i != j]
        if moved:
            dst = torch.tensor(moved, device=self.device)
            frm = torch.tensor([src[i] for i in moved], device=self.device)
            for layer in self.cache.layers:
                layer.move(dst, frm)
            self.mask[dst] = self.mask[frm]
        self.n = n
        return self.live

    def keep(self, keep_idx: list[int]) -> None:
        """Keep the rows ``keep_idx`` (batch indices), in batch order, all live again."""
        cache_pos = {b: i for i, b in enumerate(self.order)}
        order = [cache_pos[b] for b in keep_idx]
        self.rows = [self.rows[b] for b in keep_idx]
        self.order, self.n = list(range(len(self.rows))), len(self.rows)
        if order == list(range(len(cache_pos))):
            return
        index = torch.tensor(order, dtype=torch.long, device=self.device)
        self.mask = self.mask[index]
        for layer in self.cache.layers:
            layer.select(index)

    def _forward(self, chunks: list[list[int]], fed: list[int]) -> torch.Tensor:
        """Run the network on rows [0, len(chunks)) of the cache; logits after each last token."""
        width, pad = max(len(c) for c in chunks), self.policy.pad_id
        n = len(chunks)
        if width == 1 and all(chunks):  # a decode step: one token a row, built without a loop
            ids, pos = torch.tensor(chunks), torch.tensor(fed).unsqueeze(1)
            new_mask = torch.ones(n, 1, dtype=torch.long)
            return self._run(ids, new_mask, pos, n, width)
        ids = torch.full((n, width), pad, dtype=torch.long)
        new_mask = torch.zeros(n, width, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        for b, (chunk, start) in enumerate(zip(chunks, fed)):
            k = len(chunk)
            if k:
                ids[b, width - k:] = torch.tensor(chunk)
                new_mask[b, width - k:] = 1
                pos[b, width - k:] = torch.arange(start, start + k)
            pos[b, :width - k] = start
        return self._run(ids, new_mask, pos, n, width)

    def _run(self, ids: torch.Tensor, new_mask: torch.Tensor, pos: torch.Tensor, n: int,
             width: int) -> torch.Tensor:
        """Add the chunks' ``width`` columns to the mask, run the network on rows [0, n)."""
        dev, end = self.device, self.width + width
        self.mask = _grown(self.mask, 1, end)
        self.mask[:n, self.width:end] = new_mask.to(dev)
        self.width = end
        with rollout_autocast(dev, self.precision):
            out = self.policy.backbone(input_ids=ids.to(dev), attention_mask=self.mask[:n, :end],
                                       position_ids=pos.to(dev), cache=self.cache, use_cache=True)
            if self.precision == "bf16":  # a bf16 engine's logits: the head in bf16 too
                return self.policy.base.get_output_embeddings()(
                    out.last_hidden_state[:, -1]).float()
        # the sampling distribution in fp32, like the logprobs the update compares it with
        with full_precision(dev):
            return self.policy.base.get_output_embeddings()(out.last_hidden_state[:, -1].float())
