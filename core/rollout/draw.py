"""Drawing each row's next token in the rollout (core/rollout/engine.py): one uniform number a row
and an inverse CDF over the row's (temperature-scaled, top-p truncated) probabilities.

torch.multinomial's way, ``argmax(p / q)`` with q ~ Exp(1), costs V exponentials a row and token
(49,152 for SmolLM2's vocabulary: half of a CPU rollout's time went there). The inverse CDF
needs one number a row; its sums are taken in two levels (``_inverse_cdf``) because a float64
cumsum over V is slow on a CPU and a float32 one rounds away the tail's mass.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_BLOCK = 128
"""Tokens per block of the two-level inverse CDF (``_inverse_cdf``)."""
_TOP_P_CANDIDATES = 256
"""Tokens a row's nucleus is first looked for among (``_nucleus_floor``)."""


@dataclass
class Draw:
    """One sampling step's result for ``n`` rows (``sample_next``)."""
    tokens: list[int]
    logp: list[float]
    """Each row's logprob of its token under the temperature-scaled distribution."""
    entropy: list[float]
    z: torch.Tensor
    """(n, V) the temperature-scaled logits; with ``lse`` the logprob of any other token."""
    lse: torch.Tensor
    """(n,) log-sum-exp of ``z``."""

    def logp_of(self, i: int, token: int) -> float:
        return float(self.z[i, token] - self.lse[i])


def sample_next(logits: torch.Tensor, temperature: float, top_p: float,
                generator: torch.Generator, rows: list[int] | None = None,
                batch_rows: int | None = None) -> Draw:
    """Sample one token per row from logits (n, V).

    temperature 0 is greedy (the argmax of the logits; logprobs then of the untempered
    distribution). Otherwise each row's token is the inverse CDF of its temperature-scaled (and
    top-p truncated) distribution at one uniform number: ``batch_rows`` uniforms (default n) are
    drawn from ``generator`` per call, and ``rows`` says which batch rows the logits belong to
    (default all, in order). A row thus gets the same uniform, and the same token, whether or not
    the batch's rows that already stopped are still computed; the draw costs one random number a
    row, not one per vocabulary entry.
    """
    z = logits.float()
    if temperature > 0 and temperature != 1.0:
        z = z / temperature
    probs = torch.softmax(z, dim=-1)
    if temperature == 0:
        tokens = logits.argmax(-1)
    else:
        u = torch.rand(batch_rows or probs.shape[0], generator=generator, dtype=torch.float64,
                       device=probs.device)
        if rows is not None:
            u = u[torch.tensor(rows, device=u.device)]
        if top_p < 1.0:
            tokens = _top_p_draw(probs, top_p, u)
        else:
            tokens = _inverse_cdf(probs, u)
    p_tok = probs.gather(-1, tokens[:, None]).squeeze(-1)
    # log p of the drawn token (p >= 1/V for the argmax; a sampled token's p is not tiny), and
    # from it the normaliser: no (n, V) log_softmax needed
    logp = p_tok.log()
    lse = z.gather(-1, tokens[:, None]).squeeze(-1) - logp
    # H = lse - E_p[z]; nansum: a -inf logit's 0 * -inf (nan logits fail the draw already)
    entropy = lse - (probs * z).nansum(-1)
    return Draw(tokens.tolist(), logp.tolist(), entropy.tolist(), z, lse)


def _top_p_draw(probs: torch.Tensor, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """The inverse CDF, in vocabulary order, over each row's nucleus: the tokens whose probability
    is at least tau, the probability of the last token the nucleus needs (``_nucleus_floor``).
    Tokens of equal probability are kept or dropped together, so the nucleus does not depend on
    the order a sort puts ties in; otherwise it is the usual one (most likely first, while the
    mass before a token is at most top_p)."""
    tau = _nucleus_floor(probs, top_p)
    return _inverse_cdf(probs.masked_fill(probs < tau[:, None], 0.0), u)


def _nucleus_floor(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """(n,) tau = max{v : the mass of the row's tokens with p >= v exceeds top_p}: the probability
    of the token at which the row's mass, most likely first, first exceeds top_p (where the whole
    row's mass does not, from rounding, its least likely token's). Sums in float64: a top_p
    within float64 rounding (~1e-16) of a sum of the row's largest probabilities may keep one
    token (or tied group) more or fewer than exact arithmetic would.

    On a CPU, numpy's vectorised selection and sort: the ``_TOP_P_CANDIDATES`` most likely
    tokens of each row (``np.partition``) hold tau where their mass exceeds top_p; a row whose
    nucleus reaches beyond them (a flat distribution: an untrained model's, a high temperature's)
    is sorted in full, values only (3 ms for 32 rows of 49,152). torch.sort took 97 ms for them,
    ten of the tiny model's decode steps, and ``topk`` of the candidates 4 ms. Elsewhere,
    torch.sort."""
    p = probs.detach()
    if p.dtype not in (torch.float32, torch.float64):
        p = p.float()
    if p.device.type != "cpu":
        return _floor_of_sorted(p.sort(dim=-1).values, top_p)[0].to(probs.dtype)
    a = p.numpy()
    n, V = a.shape
    k = min(V, _TOP_P_CANDIDATES)
    top = np.sort(np.partition(a, V - k, axis=-1)[:, V - k:], axis=-1)  # (n, k) ascending
    tau, mass = _floor_of_sorted(torch.from_numpy(top), top_p)
    # the candidates hold tau where their mass exceeds top_p; the other rows are sorted whole
    wide = mass <= top_p
    if k < V and bool(wide.any()):
        tau[wide] = _floor_of_sorted(torch.from_numpy(np.sort(a[wide.numpy()], axis=-1)),
                                     top_p)[0]
    return tau.to(probs.dtype)


def _floor_of_sorted(ascending: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``_nucleus_floor`` of rows sorted in ascending order, and the rows' float64 mass: the
    last entry from which on the mass exceeds top_p, i.e. the first i with cum[i] >= total -
    top_p (cum[i - 1] < total - top_p); entry 0 where the whole row's mass is at most top_p."""
    cum = ascending.cumsum(-1, dtype=torch.float64)
    total = cum[:, -1]
    last = torch.searchsorted(cum, (total - top_p)[:, None]).clamp(max=cum.shape[-1] - 1)
    return ascending.gather(-1, last).squeeze(-1), total


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index i of each row with C[i-1] <= u * C[V-1] < C[i], C the row's cumulative sums: a draw
    from probs (n, V) (unnormalised, >= 0) at the uniforms u (n,) in [0, 1). Two levels, so the
    sums are exact enough without a float64 cumsum over V (slow on a CPU): float64 cumulative
    sums over blocks of ``_BLOCK`` entries pick the block, then over the chosen block's entries.
    A zero-probability entry is never picked."""
    n, V = probs.shape
    nb = -(-V // _BLOCK)
    if nb * _BLOCK != V:
        probs = torch.nn.functional.pad(probs, (0, nb * _BLOCK - V))
    blocks = probs.view(n, nb, _BLOCK)
    cum = blocks.sum(-1).double().cumsum(-1)                                  # (n, nb)
    total = cum[:, -1]
    if not bool(torch.isfinite(total).all()):  # what torch.multinomial refuses too
        raise RuntimeError("sampling: the probabilities contain nan (the logits were nan or inf)")
    zero = torch.zeros_like(total)
    # below the total even where u * total rounds up: the block found then has mass
    x = torch.minimum(u * total, total.nextafter(zero))
    b = torch.searchsorted(cum, x[:, None], right=True).squeeze(-1)           # (n,)
    before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp(min=0)[:, None]).squeeze(-1), zero)
    mass = cum.gather(-1, b[:, None]).squeeze(-1) - before
    inner = blocks.gather(1, b[:, None, None].expand(n, 1, _BLOCK)).squeeze(1).double().cumsum(-1)
    last = inner[:, -1]
    y = torch.minimum((x - before) / mass * last, last.nextafter(zero))
    j = torch.searchsorted(inner, y[:, None], right=True).squeeze(-1)
    return b * _BLOCK + j
