"""The book's one check helper: a claim, its independent evaluation, and the wrong variants it rejects.

Shared infrastructure (not a chapter). Every check cell of the book goes through :func:`verify`, which

1. compares what the package computes (``got``) with an independent evaluation (``expected``: a loop,
   NumPy, a closed form, or PyTorch's own module), and
2. evaluates each named wrong variant (a :class:`Mistake`, the same record the lab checkers use) and
   asserts that the comparison *rejects* it, so a check that could not fail cannot be written.

It prints one verdict line, e.g.::

    ✓ (3.1) softmax weights = double loop, max |Δ| 4.4e-16; rejects: softmax over the queries (Δ 0.61),
      no max subtraction (overflow)

and raises :class:`CheckFailed` when the claim is false or a wrong variant passes too. ``got``,
``expected`` and each mistake's ``wrong`` may be values or functions; functions are called with
``inputs``. A variant that raises, or produces NaN or inf, counts as rejected and says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["CheckFailed", "Mistake", "Verdict", "bound", "verify"]

RELATIONS = ("==", "<=", ">=", "<", ">")


class CheckFailed(AssertionError):
    """A claim is false, or one of its wrong variants is not rejected (the check cannot fail)."""


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer: ``why`` it is wrong (what the reader or learner is told) and ``wrong``,
    a function that makes the mistake (called with the same inputs as the right answer), or the wrong
    value itself. Used by :func:`verify` in the book and by the labs' exercise checkers."""

    why: str
    wrong: Callable[..., Any] | Any


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify`: the claim, the largest difference, and each rejected variant."""

    claim: str
    delta: float
    relation: str
    rejected: tuple[tuple[str, str], ...]  # (why, how it was rejected)

    @property
    def line(self) -> str:
        if self.relation == "==":
            head = f"✓ {self.claim}, max |Δ| {_fmt(self.delta)}"
        else:
            head = f"✓ {self.claim}, margin {_fmt(self.delta)}"
        rejects = ", ".join(f"{why} ({how})" for why, how in self.rejected)
        return f"{head}; rejects: {rejects}"

    def __str__(self) -> str:
        return self.line

    __repr__ = __str__

    def _ipython_display_(self) -> None:  # already printed by verify(); show nothing twice
        pass


def verify(
    claim: str,
    got: Any,
    expected: Any,
    *,
    mistakes: Sequence[Mistake],
    inputs: tuple = (),
    atol: float = 1e-10,
    rtol: float = 0.0,
    relation: str = "==",
    quiet: bool = False,
) -> Verdict:
    """Check ``got`` against ``expected`` and prove the check can fail; print one verdict line.

    Args:
        claim: what is claimed, starting with the equation number as the reader sees it,
            e.g. ``"(3.1) softmax weights = double loop"``.
        got: the package's result (a tensor, array, number or bool), or a function of ``inputs``.
        expected: the independent evaluation, or a function of ``inputs``.
        mistakes: at least one :class:`Mistake`; each wrong variant must be rejected.
        inputs: positional arguments for whichever of ``got``, ``expected``, ``wrong`` are functions.
        atol, rtol: the comparison's tolerances (``|got - expected| <= atol + rtol |expected|``).
        relation: ``"=="`` (close within tolerance) or an inequality ``got <= expected`` etc.,
            element-wise, with ``atol`` as slack.
        quiet: return the verdict without printing it (for tests).

    Raises:
        ValueError: no mistakes were given, or an unknown relation.
        CheckFailed: the claim does not hold, or a wrong variant is not rejected.
    """
    if not mistakes:
        raise ValueError(
            f"verify({claim!r}) needs at least one Mistake: a check that rejects no wrong variant "
            "cannot show that it can fail. Add mistakes=[Mistake('what is wrong', wrong_fn)]."
        )
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    exp = _as_tensor(_call(expected, inputs), "expected", claim)
    value = _as_tensor(_call(got, inputs), "got", claim)
    ok, delta, why_not = _judge(value, exp, relation, atol, rtol)
    if not ok:
        raise CheckFailed(f"✗ {claim}: {why_not}")
    rejected = []
    for mistake in mistakes:
        if not isinstance(mistake, Mistake):
            raise ValueError(f"mistakes must be Mistake(why, wrong) records, got {mistake!r}")
        try:
            wrong = _as_tensor(_call(mistake.wrong, inputs), "wrong", claim)
        except CheckFailed:
            raise
        except Exception as err:  # a wrong variant that cannot even run is rejected
            rejected.append((mistake.why, f"raises {type(err).__name__}"))
            continue
        if wrong.is_floating_point() and not torch.isfinite(wrong).all():
            rejected.append((mistake.why, "overflow" if torch.isinf(wrong).any() else "NaN"))
            continue
        w_ok, w_delta, _ = _judge(wrong, exp, relation, atol, rtol)
        if w_ok:
            raise CheckFailed(
                f"✗ {claim}: the wrong variant {mistake.why!r} passes too (Δ {_fmt(w_delta)}), "
                "so this check cannot tell it apart; tighten the tolerance or compare more."
            )
        if w_delta is None:
            rejected.append((mistake.why, "shape differs"))
        elif relation == "==":
            rejected.append((mistake.why, f"Δ {_fmt(w_delta)}"))
        elif w_delta == 0:
            rejected.append((mistake.why, "on the bound, which a strict inequality excludes"))
        else:
            rejected.append((mistake.why, f"violates by {_fmt(-w_delta)}"))
    verdict = Verdict(claim, float(delta), relation, tuple(rejected))
    if not quiet:
        print(verdict.line)
    return verdict


def _call(x: Any, inputs: tuple) -> Any:
    return x(*inputs) if callable(x) and not isinstance(x, Tensor | np.ndarray) else x


def _as_tensor(x: Any, what: str, claim: str) -> Tensor:
    if isinstance(x, Tensor):
        t = x.detach().cpu()
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise CheckFailed(
                f"✗ {claim}: {what} is a {type(x).__name__}, not a number, array or tensor"
            ) from err
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        return t.to(torch.complex128)
    return t.to(torch.float64)


def _judge(got: Tensor, exp: Tensor, relation: str, atol: float, rtol: float):
    """(holds, delta, reason): delta is max |got - expected| for ``==``, else the smallest margin."""
    if got.shape != exp.shape:
        if exp.numel() != 1 or relation == "==":
            return False, None, f"shape {tuple(got.shape)} differs from {tuple(exp.shape)}"
        exp = exp.expand(got.shape)
    if got.dtype == torch.bool or exp.dtype == torch.bool:
        equal = bool((got.to(torch.bool) == exp.to(torch.bool)).all())
        n_diff = int((got.to(torch.bool) != exp.to(torch.bool)).sum())
        return equal, float(n_diff), f"{n_diff} entries differ"
    if relation == "==":
        if got.numel() == 0:
            return True, 0.0, ""
        both_inf = torch.isinf(got) & torch.isinf(exp) & (got == exp)
        diff = torch.where(both_inf, torch.zeros_like(got.real.double()), (got - exp).abs())
        bound = atol + rtol * exp.abs()
        if torch.isnan(diff).any():
            return False, math.nan, "NaN in the comparison"
        excess = diff - bound
        ok = bool((excess <= 0).all())
        delta = float(diff.max())
        idx = int(excess.reshape(-1).argmax())
        return (
            ok,
            delta,
            (
                f"max |Δ| {_fmt(delta)} exceeds the tolerance (atol {atol:g}, rtol {rtol:g}); "
                f"worst entry {idx}: got {got.reshape(-1)[idx].item():.6g}, "
                f"expected {exp.reshape(-1)[idx].item():.6g}"
            ),
        )
    margin = {
        "<=": exp - got + atol,
        "<": exp - got,
        ">=": got - exp + atol,
        ">": got - exp,
    }[relation]
    strict = relation in ("<", ">")
    ok = bool((margin > 0).all()) if strict else bool((margin >= 0).all())
    smallest = float(margin.min()) - (0.0 if strict else atol)
    return ok, smallest, f"got {relation} expected fails by {_fmt(-smallest)}"


def _fmt(x: float | None) -> str:
    if x is None:
        return "n/a"
    if x == 0 or math.isnan(x) or math.isinf(x):
        return f"{x:g}"
    return f"{x:.2g}" if abs(x) >= 1e-3 and abs(x) < 1e4 else f"{x:.1e}"


def bound(x: float, floor: float = 1e-12) -> str:
    """A difference printed as a bound that does not depend on the machine: ``"below 1e-12"``.

    Rounding errors differ between processors (4e-16 on one, 7e-16 on another), so a stored output that
    printed them would change from machine to machine. The bound is the power of ten two orders above
    ``x``, and never below ``floor``: 7e-16 and 4e-16 both read "below 1e-12", 3e-07 reads "below 1e-04".
    """
    if math.isnan(x) or math.isinf(x):
        return f"{x:g}"
    exponent = math.ceil(math.log10(x)) + 2 if x > 0 else -math.inf
    return f"below {max(10.0**exponent, floor):.0e}"
