"""The book's one check helper, ``tc.checks.verify``: it passes true claims, fails false ones, and
refuses to pass a check whose named wrong variant would pass too (a check that cannot fail)."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_course as tc
from transformer_course.checks import CheckFailed, Mistake, verify


def softmax_loop(S):
    out = torch.empty_like(S)
    for n in range(S.shape[0]):
        z = sum(math.exp(float(s)) for s in S[n])
        for m in range(S.shape[1]):
            out[n, m] = math.exp(float(S[n, m])) / z
    return out


@pytest.fixture
def S():
    return torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0))


def test_a_true_claim_prints_one_verdict_naming_each_rejected_variant(S, capsys):
    v = verify(
        "(3.1) softmax weights = loop",
        torch.softmax(S, -1),
        softmax_loop,
        inputs=(S,),
        mistakes=[
            Mistake("softmax over the wrong axis", lambda S: torch.softmax(S, 0)),
            Mistake("no max subtraction", lambda S: torch.exp(S * 1e3) / torch.exp(S * 1e3)),
            Mistake("returns a transpose", lambda S: torch.softmax(S, -1).T),
        ],
        atol=1e-12,
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0] == v.line
    assert out[0].startswith("✓ (3.1) softmax weights = loop, max |Δ| ")
    assert "rejects: softmax over the wrong axis (Δ " in out[0]
    assert "no max subtraction (NaN)" in out[0] or "no max subtraction (overflow)" in out[0]
    assert "returns a transpose (shape differs)" in out[0]
    assert v.delta < 1e-12


def test_a_false_claim_fails_with_the_worst_entry(S):
    with pytest.raises(CheckFailed, match="exceeds the tolerance"):
        verify(
            "(3.1) softmax weights = loop",
            torch.softmax(S, 0),
            softmax_loop(S),
            mistakes=[Mistake("anything", torch.zeros(4, 5))],
        )


def test_a_check_whose_wrong_variant_passes_too_is_refused(S):
    with pytest.raises(CheckFailed, match="passes too"):
        verify(
            "rows sum to one",
            torch.softmax(S, -1).sum(-1),
            torch.ones(4),
            mistakes=[Mistake("softmax over the wrong axis", torch.softmax(S, 0).sum(0)[:4])],
            atol=1e-6,
        )


def test_a_tolerance_too_loose_to_fail_is_refused(S):
    with pytest.raises(CheckFailed, match="cannot tell it apart"):
        verify(
            "weights",
            torch.softmax(S, -1),
            softmax_loop(S),
            mistakes=[Mistake("softmax of scores / 2", torch.softmax(S / 2, -1))],
            atol=1.0,
        )


def test_no_mistakes_is_an_error_that_says_how_to_fix_it(S):
    with pytest.raises(ValueError, match="needs at least one Mistake"):
        verify("claim", S, S, mistakes=[])
    with pytest.raises(ValueError, match="Mistake\\(why, wrong\\)"):
        verify("claim", S, S, mistakes=[("why", S)])
    with pytest.raises(ValueError, match="relation must be one of"):
        verify("claim", S, S, mistakes=[Mistake("x", S + 1)], relation="~")


def test_a_variant_that_raises_counts_as_rejected(S):
    def broken(S):
        raise RuntimeError("shapes do not match")

    v = verify(
        "same", S, S.clone(), inputs=(S,), mistakes=[Mistake("wrong shapes", broken)], quiet=True
    )
    assert v.rejected == (("wrong shapes", "raises RuntimeError"),)


def test_inequalities_report_their_margin_and_reject_violations():
    v = verify(
        "LP value <= achievable error",
        0.25,
        0.5,
        relation="<=",
        mistakes=[Mistake("a bound above the achievable error", 0.75)],
        quiet=True,
    )
    assert v.line.startswith("✓ LP value <= achievable error, margin 0.25")
    assert "violates by 0.25" in v.line
    with pytest.raises(CheckFailed, match="fails by"):
        verify("x > 1", 0.5, 1.0, relation=">", mistakes=[Mistake("x", 0.0)], quiet=True)


def test_booleans_compare_exactly_and_count_differing_entries():
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    v = verify(
        "causal mask = lower triangle",
        tc.self_attention.causal_mask(3),
        mask,
        mistakes=[Mistake("upper triangle", mask.T)],
        quiet=True,
    )
    assert v.rejected == (("upper triangle", "Δ 6"),)


def test_exercises_and_checks_share_one_mistake_record():
    assert tc.exercises.Mistake is Mistake


def test_the_verdict_is_not_displayed_twice_in_a_notebook(S):
    v = verify("same", S, S.clone(), mistakes=[Mistake("off by one", S + 1)], quiet=True)
    assert v._ipython_display_() is None and str(v) == v.line


def test_a_variant_exactly_on_a_strict_bound_says_so():
    v = verify("x < 1", 0.5, 1.0, relation="<", mistakes=[Mistake("x = 1", 1.0)], quiet=True)
    assert v.rejected == (("x = 1", "on the bound, which a strict inequality excludes"),)


def test_a_difference_is_printed_as_a_bound_that_rounding_does_not_move():
    """Rounding errors differ between processors; their bound does not (tc.checks.bound)."""
    assert tc.checks.bound(4e-16) == tc.checks.bound(7e-16) == tc.checks.bound(0.0) == "below 1e-12"
    assert tc.checks.bound(5e-15) == "below 1e-12"
    assert tc.checks.bound(3e-7) == "below 1e-04"
    assert tc.checks.bound(2e-11, floor=1e-14) == "below 1e-08"
