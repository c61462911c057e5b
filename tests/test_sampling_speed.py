"""The rollout's sampler (core/rollout/draw.py ``sample_next``): one uniform number a row, an
inverse CDF over the row's probabilities, instead of one exponential per vocabulary entry.

What it must keep: the draws follow the (temperature-scaled, top-p truncated) distribution; a
row's token does not depend on which other rows of the batch are still computed; a seed
reproduces the draws; greedy is the argmax; a token of probability zero is never drawn. Top-p
finds each row's nucleus without sorting it with torch (97 ms a step for 32 rows of 49,152:
a flat row, an untrained model's, made top-p rollouts ten times slower).
"""
from __future__ import annotations

import math

import pytest
import torch

from core.rollout.draw import _TOP_P_CANDIDATES, _inverse_cdf, _nucleus_floor, sample_next

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, float("-inf"), 0.5, -3.0, 1.5, -0.5, 0.25])


def _chi_square(tokens: list[int], probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens of positive probability, and its degrees of freedom;
    a draw of a zero-probability token fails here."""
    counts = torch.bincount(torch.tensor(tokens), minlength=len(probs)).double()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was drawn"
    keep = probs > 0
    expected = len(tokens) * probs[keep]
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


def _chi_square_limit(dof: int) -> float:
    """The chi-square quantile at 1 - 1e-4 (Wilson-Hilferty): a correct sampler stays below it
    but for a 1e-4 chance (the seeds are fixed: it passes or fails the same way every time)."""
    z = 3.719
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_the_draws_follow_the_distribution(temperature, top_p):
    n = 60_000
    generator = torch.Generator().manual_seed(3)
    draw = sample_next(LOGITS.repeat(n, 1), temperature, top_p, generator)
    probs = torch.softmax(LOGITS.double() / temperature, -1)
    if top_p < 1.0:  # the smallest set of the most likely tokens whose mass reaches top_p
        sorted_p, order = probs.sort(descending=True)
        sorted_p[sorted_p.cumsum(-1) - sorted_p > top_p] = 0.0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_p)
        probs /= probs.sum()
        assert (probs == 0).sum() > 1   # the truncation is under test: it drops real tokens
    stat, dof = _chi_square(draw.tokens, probs)
    assert stat < _chi_square_limit(dof), (stat, dof)
    # each row's logprob and entropy are the tempered, untruncated distribution's
    logp = torch.log_softmax(LOGITS / temperature, -1)
    assert max(abs(lp - float(logp[t])) for lp, t in zip(draw.logp[:200], draw.tokens)) < 1e-5
    finite = logp[logp.isfinite()]
    assert abs(draw.entropy[0] - float(-(finite.exp() * finite).sum())) < 1e-5
    assert abs(draw.logp_of(0, 1) - float(logp[1])) < 1e-5


def test_a_vocabulary_of_several_blocks_is_drawn_right():
    """A vocabulary that fills several blocks of the two-level search, its last one partly, with
    its mass in a few tokens spread over them."""
    V = 1000
    logits = torch.full((V,), -30.0)
    hot = [0, 127, 128, 500, 999]
    logits[hot] = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5])
    generator = torch.Generator().manual_seed(5)
    tokens = sample_next(logits.repeat(20_000, 1), 1.0, 1.0, generator).tokens
    probs = torch.softmax(logits.double(), -1)
    assert set(tokens) <= set(hot)  # the others' mass is ~1e-11: never drawn in 20k draws
    hot_p = probs[hot] / probs[hot].sum()
    counts = [tokens.count(h) for h in hot]
    stat = sum((c - len(tokens) * float(p)) ** 2 / (len(tokens) * float(p))
               for c, p in zip(counts, hot_p))
    assert stat < _chi_square_limit(len(hot) - 1), (stat, counts)


def test_the_ends_of_the_unit_interval_draw_tokens_of_positive_probability():
    """u = 0 and the largest u below 1, over zeros at both ends of the row (a top-p tail, padding)."""
    probs = torch.zeros(2, 300)
    probs[:, 5] = 0.25
    probs[:, 200] = 0.75
    u = torch.tensor([0.0, torch.tensor(1.0, dtype=torch.float64).nextafter(
        torch.tensor(0.0, dtype=torch.float64)).item()], dtype=torch.float64)
    assert _inverse_cdf(probs, u).tolist() == [5, 200]
    assert _inverse_cdf(probs, torch.tensor([0.2499, 0.2501], dtype=torch.float64)).tolist() \
        == [5, 200]


def test_one_random_number_a_row_not_one_per_vocabulary_entry():
    """The generator advances by the batch's rows (float64 uniforms), whatever the vocabulary."""
    logits = torch.randn(4, 49_152, generator=torch.Generator().manual_seed(0))
    generator = torch.Generator().manual_seed(7)
    sample_next(logits[[0, 2]], 1.0, 1.0, generator, rows=[0, 2], batch_rows=4)
    reference = torch.Generator().manual_seed(7)
    torch.rand(4, generator=reference, dtype=torch.float64)
    assert torch.equal(generator.get_state(), reference.get_state())


def test_a_row_draws_the_same_token_whether_or_not_stopped_rows_are_computed():
    logits = torch.randn(6, 500, generator=torch.Generator().manual_seed(1))
    for step_seed in range(20):
        every = sample_next(logits, 1.0, 1.0, torch.Generator().manual_seed(step_seed))
        live = [5, 1, 3]  # in cache order, as the batch keeps them after parking rows
        some = sample_next(logits[live], 1.0, 1.0, torch.Generator().manual_seed(step_seed),
                           rows=live, batch_rows=6)
        assert some.tokens == [every.tokens[b] for b in live]
        assert some.logp == pytest.approx([every.logp[b] for b in live], abs=1e-6)


def test_a_seed_reproduces_the_draws_and_another_seed_changes_them():
    logits = torch.randn(16, 2000, generator=torch.Generator().manual_seed(2))

    def steps(seed: int) -> list[list[int]]:
        generator = torch.Generator().manual_seed(seed)
        return [sample_next(logits, 1.0, 0.9, generator).tokens for _ in range(5)]

    assert steps(11) == steps(11)
    assert steps(11) != steps(12)


def test_greedy_is_the_argmax_with_the_untempered_logprobs():
    logits = torch.randn(3, 700, generator=torch.Generator().manual_seed(4))
    generator = torch.Generator().manual_seed(0)
    before = generator.get_state()
    draw = sample_next(logits, 0.0, 0.5, generator)
    assert draw.tokens == logits.argmax(-1).tolist()
    assert torch.equal(generator.get_state(), before)   # greedy draws nothing
    logp = torch.log_softmax(logits, -1)
    assert draw.logp == pytest.approx([float(logp[i, t]) for i, t in enumerate(draw.tokens)],
                                      abs=1e-5)
    assert draw.entropy == pytest.approx((-(logp.exp() * logp).sum(-1)).tolist(), abs=1e-4)


@pytest.mark.parametrize("top_p, V", [(1.0, 50), (0.9, 50), (0.9, 1000)])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_logits_fail_the_draw_naming_it(bad, top_p, V):
    logits = torch.zeros(2, V)
    logits[1, 3] = bad
    with pytest.raises(RuntimeError, match="sampling: the probabilities contain nan"):
        sample_next(logits, 1.0, top_p, torch.Generator().manual_seed(0))


def test_top_p_rows_whose_nucleus_is_wide_or_narrow_draw_alike_alone_and_together():
    """A row's nucleus is looked for among its most likely few hundred tokens and sorted in full
    only where it reaches beyond them: a batch of both kinds draws what each row draws alone, and
    a wide nucleus's draws follow its truncated distribution."""
    V, top_p = 2000, 0.9
    wide = torch.linspace(0.0, 1.0, V)                    # the nucleus: ~1,800 tokens
    narrow = torch.full((V,), -20.0)
    narrow[[7, 1500, 1999]] = torch.tensor([2.0, 1.0, 0.0])
    logits = torch.stack([wide, narrow, wide, narrow])
    together = sample_next(logits, 1.0, top_p, torch.Generator().manual_seed(9)).tokens
    for b in range(4):
        alone = sample_next(logits[[b]], 1.0, top_p, torch.Generator().manual_seed(9),
                            rows=[b], batch_rows=4).tokens
        assert alone == [together[b]]

    n = 30_000
    tokens = sample_next(wide.repeat(n, 1), 1.0, top_p, torch.Generator().manual_seed(4)).tokens
    probs = torch.softmax(wide.double(), -1)
    sorted_p, order = probs.sort(descending=True)
    sorted_p[sorted_p.cumsum(-1) - sorted_p > top_p] = 0.0
    kept = order[sorted_p > 0]
    assert len(kept) > 1000 and set(tokens) <= set(kept.tolist())
    # chi-square over 20 bins of the kept tokens (in order of probability) of equal mass
    mass = torch.zeros(V, dtype=torch.float64).scatter(0, order, sorted_p)
    mass /= mass.sum()
    edges = torch.searchsorted(mass[kept].cumsum(-1), torch.linspace(0, 1, 21)[1:-1].double())
    bin_of = torch.zeros(V, dtype=torch.long)
    bin_of[kept] = torch.bucketize(torch.arange(len(kept)), edges, right=True)
    counts = torch.bincount(bin_of[torch.tensor(tokens)], minlength=20).double()
    expected = n * torch.zeros(20, dtype=torch.float64).scatter_add(0, bin_of[kept], mass[kept])
    stat = float(((counts - expected) ** 2 / expected).sum())
    assert stat < _chi_square_limit(19), stat


def test_the_rollouts_decoder_decodes_what_the_tokenizer_decodes():
    """The rollout decodes each row's action at every token with the Rust tokenizer directly;
    on ids of every kind (special tokens, bytes of a character split across tokens) the text is
    the tokenizer's own."""
    from core.model.models import load_tokenizer
    from core.rollout.engine import decoder
    tok = load_tokenizer("tiny")
    decode = decoder(tok)
    assert decode != tok.decode                          # the direct path is the one tested
    rng = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, len(tok), (n,), generator=rng).tolist() for n in (1, 5, 40)]
    samples += [tok.encode("héllo <tool_call> 日本語 </answer>\n", add_special_tokens=False)[:k]
                for k in range(1, 12)]
    samples += [[tok.eos_token_id, 5, 6], []]
    for ids in samples:
        assert decode(ids) == tok.decode(ids), ids


def _sorted_floor(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition with a full torch sort: the probability of the token, most likely first,
    at which the cumulative mass first exceeds top_p (the least likely one where none does)."""
    desc = probs.double().sort(dim=-1, descending=True).values
    over = desc.cumsum(-1) > top_p
    first = torch.where(over.any(-1), over.double().argmax(-1), probs.shape[-1] - 1)
    return desc.gather(-1, first[:, None]).squeeze(-1).to(probs.dtype)


@pytest.mark.parametrize("scale", [0.05, 0.5, 2.0, 8.0])
def test_the_nucleus_floor_is_the_sorted_definition_on_wide_and_narrow_rows(scale):
    """Flat rows (an untrained model: the nucleus reaches far beyond the candidates) and peaked
    ones (found among them), alone and in one batch, at several top_p: the floor equals the one
    a full sort gives (float64 probabilities too)."""
    generator = torch.Generator().manual_seed(int(scale * 100))
    probs = torch.softmax(torch.randn(12, 49_152, generator=generator) * scale, -1)
    for top_p in (0.1, 0.5, 0.9, 0.95, 0.999):
        reference = _sorted_floor(probs, top_p)
        assert torch.equal(_nucleus_floor(probs, top_p), reference), top_p
        kept = (probs >= reference[:, None]).sum(-1)
        if scale <= 0.5 and top_p >= 0.5:
            assert (kept > _TOP_P_CANDIDATES).all()   # the wide path is the one under test
        if scale >= 8.0 and top_p <= 0.9:
            assert (kept <= _TOP_P_CANDIDATES).all()  # and here the candidates' path
    mixed = torch.cat([torch.softmax(torch.randn(3, 49_152, generator=generator) * s, -1)
                       for s in (0.05, 8.0)])[[0, 3, 1, 4, 2, 5]]
    assert torch.equal(_nucleus_floor(mixed, 0.9), _sorted_floor(mixed, 0.9))
    wide64 = probs.double()
    assert torch.equal(_nucleus_floor(wide64, 0.9), _sorted_floor(wide64, 0.9))
    # a row whose whole mass is at most top_p (its sum rounds below 1) keeps every token
    row = probs[:1]
    whole = float(row.double().sum()) + 1e-9
    assert torch.equal(_nucleus_floor(row, whole), row.min(-1).values)
    assert torch.equal(_sorted_floor(row, whole), row.min(-1).values)


def test_tokens_of_equal_probability_are_kept_or_dropped_together():
    """Ten equal tokens and top_p 0.35: a sort would keep four of them, whichever it put first;
    the nucleus keeps all ten, and the draws are uniform over them. With three tokens tied at the
    boundary (p = 0.2 each after one of 0.4), top_p 0.5 keeps the three and drops the rest."""
    n = 20_000
    tokens = sample_next(torch.zeros(n, 10), 1.0, 0.35, torch.Generator().manual_seed(1)).tokens
    stat, dof = _chi_square(tokens, torch.full((10,), 0.1, dtype=torch.float64))
    assert dof == 9 and stat < _chi_square_limit(dof)
    probs = torch.tensor([0.4, 0.2, 0.2, 0.2, 0.1, 0.1]) / 1.2
    logits = probs.log()
    tokens = sample_next(logits.repeat(n, 1), 1.0, 0.5, torch.Generator().manual_seed(2)).tokens
    kept = torch.tensor([0.4, 0.2, 0.2, 0.2, 0.0, 0.0], dtype=torch.float64)
    stat, dof = _chi_square(tokens, kept / kept.sum())
    assert dof == 3 and stat < _chi_square_limit(dof)
