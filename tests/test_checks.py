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


def test_a_true_claim_shows_one_short_line_and_the_rejected_variants_under_it(S, capsys):
    v = verify(
        "(3.1) softmax weights = loop",
        torch.softmax(S, -1),
        softmax_loop,
        inputs=(S,),
        mistakes=[
            Mistake("softmax over the wrong axis", lambda S: torch.softmax(S, 0)),
            Mistake(
                "no max subtraction",
                lambda S: torch.exp(S * 1e3) / torch.exp(S * 1e3).sum(-1, keepdim=True),
                fails_by="nan",
            ),
        ],
        atol=1e-12,
    )
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == v.line == "✓ (3.1) softmax weights = loop"
    assert out[1].strip() == v.detail
    assert v.detail.startswith("max |Δ| below 1e-12 (tolerance 1e-12); rejects: ")
    assert "softmax over the wrong axis (misses by " in v.detail
    assert "no max subtraction (gives NaN, as it should)" in v.detail
    html = v._repr_html_()
    assert html.startswith('<details class="tc-verdict"><summary>✓ (3.1) softmax weights = loop')
    assert "softmax over the wrong axis: misses by" in html and v.delta < 1e-12


def test_a_false_claim_fails_with_the_worst_entry(S):
    with pytest.raises(CheckFailed, match="exceeds the tolerance"):
        verify(
            "(3.1) softmax weights = loop",
            torch.softmax(S, 0),
            softmax_loop(S),
            mistakes=[Mistake("anything", torch.softmax(S, -1))],
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
        verify("claim", S, S, mistakes=[Mistake("x", S * 2)], relation="~")
    with pytest.raises(ValueError, match="fails_by must be one of"):
        Mistake("x", S, fails_by="crash")
    with pytest.raises(ValueError, match="keep it to 88"):
        verify("a claim " * 12, S, S.clone(), mistakes=[Mistake("x", S * 2)])


def _refused(match, got, expected, mistake, **kw):
    with pytest.raises(ValueError, match=match):
        verify("claim", got, expected, mistakes=[mistake], quiet=True, **kw)


def test_a_variant_that_raises_changes_shape_or_overflows_proves_nothing_unless_declared(S):
    X = torch.randn(3, 5, dtype=torch.float64)
    product = X @ S.T

    def broken(X):
        return X @ S  # (3, 5) @ (4, 5): the shapes do not fit

    _refused(
        "raises RuntimeError",
        product,
        product.clone(),
        Mistake("S not transposed", broken),
        inputs=(X,),
    )
    v = verify(
        "Y = X S^T",
        product,
        product.clone(),
        inputs=(X,),
        mistakes=[Mistake("S not transposed", broken, fails_by="raises")],
        quiet=True,
    )
    assert v.rejected == (("S not transposed", "raises RuntimeError, as it should"),)
    _refused(
        "declared to raise",
        product,
        product.clone(),
        Mistake("x", lambda X: X @ S.T * 2, fails_by="raises"),
        inputs=(X,),
    )
    _refused(
        "has shape \\(5, 4\\)",
        softmax_loop(S),
        torch.softmax(S, -1),
        Mistake("x", lambda: torch.softmax(S, 0).T),
    )
    v = verify(
        "rows",
        softmax_loop(S),
        torch.softmax(S, -1),
        quiet=True,
        mistakes=[
            Mistake(
                "heads stacked along the tokens", lambda: torch.softmax(S, 0).T, fails_by="shape"
            )
        ],
    )
    assert "instead of (4, 5), as it should" in v.rejected[0][1]
    _refused(
        "not finite \\(overflow\\)", S.exp(), S.exp().clone(), Mistake("x", lambda: (S * 1e3).exp())
    )
    _refused(
        "declared to fail by overflow",
        S.exp(),
        S.exp().clone(),
        Mistake("x", lambda: (S * 2).exp(), fails_by="overflow"),
    )


def test_a_literal_constant_is_refused():
    _refused("literal constant", 4.7, 4.0, Mistake("the bound itself", 4.0), relation=">")
    _refused("literal constant", torch.ones(4), torch.ones(4), Mistake("ones", [1, 1, 2, 1]))
    _refused("literal constant", 2.5, 2.5, Mistake("x", lambda: torch.tensor(4.0)))
    _refused("negation", torch.tensor(True), torch.tensor(True), Mistake("x", torch.tensor(False)))


def test_a_variant_computed_from_got_itself_is_refused(S):
    got = torch.softmax(S, -1)
    _refused("computed from `got` itself", got, softmax_loop(S), Mistake("x", lambda: got.T.T * 2))
    _refused("the negation", got, softmax_loop(S), Mistake("sign flipped", -softmax_loop(S)))
    _refused("an offset", got, softmax_loop(S), Mistake("x", softmax_loop(S) + 0.1))
    _refused(
        "a constant", got, softmax_loop(S), Mistake("x - x", softmax_loop(S) - softmax_loop(S))
    )
    before = 3.25
    _refused(
        "computed from `got` itself", before, 4.0, Mistake("x", lambda: before - 1), relation="<"
    )
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    _refused("the negation", mask, mask.clone(), Mistake("x", ~mask))
    _refused("a constant", mask, mask.clone(), Mistake("x", torch.ones(3, 3, dtype=torch.bool)))
    # a missing scale factor is a real mistake: a multiple of got is accepted
    v = verify("S", S, S.clone(), mistakes=[Mistake("no 1/sqrt(d_k)", S * 2.0)], quiet=True)
    assert v.rejected == (("no 1/sqrt(d_k)", "misses by 4.5"),) or "misses by" in v.rejected[0][1]


def test_a_variant_that_misses_by_rounding_is_refused(S):
    # "no 1/sqrt(d_k)" placed before an RMSNorm, which cancels the scale up to its epsilon
    def rms(X):
        return X / torch.sqrt((X * X).mean(-1, keepdim=True) + 1e-6)

    _refused(
        "misses the claim by only",
        rms(S),
        rms(S).clone(),
        Mistake("no scale", lambda: rms(S * 4.0)),
        atol=1e-12,
    )
    v = verify(
        "x",
        rms(S),
        rms(S).clone(),
        mistakes=[Mistake("no scale", lambda: rms(S * 4.0))],
        atol=1e-12,
        gap=1e-9,
        quiet=True,
    )
    assert "misses by" in v.rejected[0][1]


def test_inequalities_report_their_margin_and_reject_violations():
    errors = torch.tensor([0.25, 0.4])
    v = verify(
        "LP value <= achievable error",
        errors.min(),
        0.5,
        relation="<=",
        mistakes=[Mistake("the largest error instead of the smallest", errors.max() * 2)],
        quiet=True,
    )
    assert v.detail.startswith("holds with margin 0.25")
    assert "violates it by 0.3" in v.detail
    with pytest.raises(CheckFailed, match="fails by"):
        verify("x > 1", 0.5, 1.0, relation=">", mistakes=[Mistake("x", errors.max())], quiet=True)


def test_booleans_compare_exactly_and_count_differing_entries():
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    v = verify(
        "causal mask = lower triangle",
        tc.self_attention.causal_mask(3),
        mask,
        mistakes=[Mistake("diagonal masked too", torch.ones(3, 3, dtype=torch.bool).tril(-1))],
        quiet=True,
    )
    assert v.rejected == (("diagonal masked too", "3 entries differ"),)


def test_exercises_and_checks_share_one_mistake_record():
    assert tc.exercises.Mistake is Mistake


def test_the_verdict_is_not_displayed_twice_in_a_notebook(S):
    v = verify("same", S, S.clone(), mistakes=[Mistake("doubled", S * 2)], quiet=True)
    assert v._ipython_display_() is None and str(v) == f"{v.line}\n  {v.detail}"


def test_a_variant_exactly_on_a_strict_bound_needs_a_gap_of_zero():
    ones = torch.ones(3, dtype=torch.float64)
    _refused("misses the claim by only", 0.5, 1.0, Mistake("x = 1", ones.mean()), relation="<")
    v = verify(
        "x < 1", 0.5, 1.0, relation="<", gap=0, mistakes=[Mistake("x = 1", ones.mean())], quiet=True
    )
    assert v.rejected == (("x = 1", "violates it by 0"),)


def test_each_verdict_is_logged_as_one_json_line(S, tmp_path, monkeypatch):
    import json

    log = tmp_path / "verdicts.jsonl"
    monkeypatch.setenv(tc.checks.VERDICT_LOG_ENV, str(log))
    verify("doubled", S, S.clone(), mistakes=[Mistake("doubled", S * 2)], quiet=True)
    T = S.clone()
    verify(
        "x",
        S,
        S.clone(),
        mistakes=[Mistake("raises", lambda: T @ T, fails_by="raises")],
        quiet=True,
    )
    first, second = (json.loads(line) for line in log.read_text().splitlines())
    assert first["claim"] == "doubled" and first["rejected"][0]["how"].startswith("misses by")
    assert second["rejected"][0] == {
        "why": "raises",
        "how": "raises RuntimeError, as it should",
        "fails_by": "raises",
    }


def test_a_difference_is_printed_as_a_bound_that_rounding_does_not_move():
    """Rounding errors differ between processors; their bound does not (tc.checks.bound)."""
    assert tc.checks.bound(4e-16) == tc.checks.bound(7e-16) == tc.checks.bound(0.0) == "below 1e-12"
    assert tc.checks.bound(5e-15) == "below 1e-12"
    assert tc.checks.bound(3e-7) == "below 1e-04"
    assert tc.checks.bound(2e-11, floor=1e-14) == "below 1e-08"
