"""The checker framework: every verdict is explained, learner bugs never crash a notebook."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import Exercise, check, list_exercises, solution

ALL = list_exercises()


def test_importing_the_package_imports_no_exercise():
    import subprocess
    import sys

    code = (
        "import sys, transformer_course as tc; "
        "print(sorted(m for m in sys.modules if 'exercises' in m)); "
        "tc.exercises.check('notation.row_self_attention', None); "
        "print(sorted(m for m in sys.modules if 'exercises' in m))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    before, after = done.stdout.splitlines()
    assert before == "[]"
    assert "transformer_course.exercises.notation" in after and ".vision" not in after


def test_registry_has_the_notation_exercises():
    assert {
        "notation.row_self_attention",
        "notation.turner_self_attention",
        "notation.turner_to_row_weights",
    } <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_every_reference_solution_passes_its_checker(name):
    feedback = check(name, tc.exercises._get(name).solution)
    assert feedback, str(feedback)
    assert feedback.status == "correct"


@pytest.mark.parametrize("name", ALL)
def test_every_mistake_differs_from_the_solution_on_some_trial(name):
    """Computed directly, not through the checker: each mistake gives another output than the
    solution on at least one trial, or no learner who makes it could be told. A mistake may match
    the solution on some trials by design (a missing causal mask on a trial without one, a
    square-image formula on a square image): the checker runs every trial, so another catches it."""
    ex = tc.exercises._get(name)
    if type(ex) is not tc.exercises.Exercise:  # a checker of whole modules (labs 4, 7, 8, 9)
        pytest.skip(f"{type(ex).__name__}: its chapter's tests prove its mistakes differ")
    assert ex.trials > 0, f"{name} runs no trial"
    assert ex.mistakes, f"{name} knows no mistake to tell a learner about"
    caught = [False] * len(ex.mistakes)
    for trial in range(ex.trials):
        args = ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
        expected = ex.solution(*args)
        for k, mistake in enumerate(ex.mistakes):
            got = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
            if got.shape != expected.shape or not torch.allclose(got, expected, equal_nan=True):
                caught[k] = True
    assert all(caught), [m.why for m, seen in zip(ex.mistakes, caught, strict=True) if not seen]


@pytest.mark.parametrize("name", ALL)
def test_every_known_mistake_is_diagnosed(name):
    ex = tc.exercises._get(name)
    for mistake in ex.mistakes:
        feedback = check(name, mistake.wrong)
        assert not feedback
        assert feedback.status == "incorrect"
        assert mistake.why in feedback.message, (mistake.why, feedback.message)


def test_not_attempted_and_errors_are_reported_not_raised():
    def todo(*args):
        raise NotImplementedError

    def buggy(X, W_q, W_k, W_v):
        return X @ W_q @ W_k  # shapes do not fit

    assert check("notation.row_self_attention", todo).status == "not attempted"
    assert check("notation.row_self_attention", None).status == "not attempted"
    fb = check("notation.row_self_attention", buggy)
    assert fb.status == "error" and "RuntimeError" in fb.message and "line" in fb.message
    fb = check("notation.row_self_attention", "not a function")
    assert fb.status == "incorrect" and "expects your function itself" in fb.message


def test_generic_diagnoses():
    def returns_none(X, W_q, W_k, W_v):
        pass

    def wrong_shape(X, W_q, W_k, W_v):
        return tc.self_attention.single_head(X, W_q, W_k, W_v)[:-1]

    def off(X, W_q, W_k, W_v):
        return tc.self_attention.single_head(X, W_q, W_k, W_v) + 1e-3

    def nan(X, W_q, W_k, W_v):
        return tc.self_attention.single_head(X, W_q, W_k, W_v) * float("nan")

    def as_list(X, W_q, W_k, W_v):
        return tc.self_attention.single_head(X, W_q, W_k, W_v).tolist()

    name = "notation.row_self_attention"
    assert "forget `return`" in check(name, returns_none).message
    assert "wrong shape" in check(name, wrong_shape).message
    msg = check(name, off).message
    assert "largest error 0.001" in msg and "index" in msg
    assert "NaN" in check(name, nan).message
    assert check(name, as_list), "a nested list with the right values is accepted"


def test_rows_not_summing_to_one_and_wrong_axis_are_explained():
    name = "notation.turner_to_row_weights"
    fb = check(name, lambda A_cols: A_cols)  # forgot to transpose: the exercise names it
    assert "Turner's matrix unchanged" in fb.message
    fb = check(name, lambda A_cols: A_cols.flip(1))  # columns still sum to one, rows do not
    assert "columns sum to one but the rows do not" in fb.message
    fb = check(name, lambda A_cols: 2 * A_cols.T)
    assert "rows of attention weights must sum to one" in fb.message


def test_square_transpose_is_named():
    ex = Exercise(
        name="test.square",
        prompt="",
        solution=lambda M: M.tril(),
        make_inputs=lambda gen, trial: (torch.randn(4, 4, generator=gen, dtype=torch.float64),),
    )
    assert "off by a transpose" in ex.check(lambda M: M.tril().T).message


def test_solution_is_printed_without_decorator(capsys):
    src = solution("notation.row_self_attention")
    assert src.startswith("def row_self_attention(")
    assert "@exercise" not in src and "math.sqrt" in src
    assert capsys.readouterr().out.strip() == src.strip()


def test_unknown_exercise_lists_known_ones():
    with pytest.raises(KeyError, match=r"known exercises: .*notation\.row_self_attention"):
        check("notation.nope", lambda: None)


def test_feedback_reads_well():
    fb = check(
        "notation.row_self_attention", tc.exercises._get("notation.row_self_attention").solution
    )
    assert str(fb).startswith("✅ notation.row_self_attention: matches the reference")
    assert math.isfinite(len(repr(fb)))


def test_a_known_mistake_that_gives_nan_is_named_not_reported_as_nan():
    """A mistake may itself produce NaN (e.g. a mask that hides every key of a row): the checker
    matches it, NaN for NaN, before falling back to the generic NaN message."""

    def masked_softmax(S):
        return torch.softmax(S.masked_fill(torch.eye(len(S), dtype=torch.bool), -math.inf), -1)

    def every_key_hidden(S):  # the mask inverted on the last row: that row is all -inf
        hide = ~torch.eye(len(S), dtype=torch.bool)
        hide[-1] = True
        return torch.softmax(S.masked_fill(hide, -math.inf), -1)

    ex = Exercise(
        name="test.nan_mistake",
        prompt="",
        solution=masked_softmax,
        make_inputs=lambda gen, trial: (torch.randn(4, 4, generator=gen, dtype=torch.float64),),
        mistakes=[tc.exercises.Mistake("every key of the last row hidden", every_key_hidden)],
    )
    assert ex.check(every_key_hidden).message.startswith("every key of the last row hidden")

    def other_nan(S):
        return masked_softmax(S) * float("nan")

    assert "NaN" in ex.check(other_nan).message


def test_rows_that_are_not_attention_weights_are_named_by_what_they_are():
    """The messages about rows that do not sum to one say what a row holds and what it runs over:
    attention weights over the keys by default, a sampling distribution over the vocabulary for
    lab 7's temperature and top-k exercises."""
    ex = Exercise(
        name="test.distribution",
        prompt="",
        solution=lambda z: torch.softmax(z, dim=-1),
        make_inputs=lambda gen, trial: (torch.randn(3, 5, generator=gen, dtype=torch.float64),),
        rows_sum_to_one=True,
        rows_of="the sampling distribution",
        row_axis="the vocabulary",
    )
    message = ex.check(lambda z: 2 * torch.softmax(z, dim=-1)).message
    assert "rows of the sampling distribution must sum to one" in message
    assert "attention" not in message
    message = ex.check(lambda z: torch.softmax(z, dim=0)).message
    assert "over the vocabulary" in message and "keys" not in message
    default = Exercise(name="test.weights", prompt="", solution=ex.solution, make_inputs=ex.make_inputs,
                       rows_sum_to_one=True)  # fmt: skip
    assert "rows of attention weights" in default.check(lambda z: 2 * torch.softmax(z, -1)).message
