"""The book's one check helper: a claim, its independent evaluation, and the wrong variants it rejects.

Shared infrastructure (not a chapter). Every check cell of the book goes through :func:`verify`, which

1. compares what the package computes (``got``) with an independent evaluation (``expected``: a loop,
   NumPy, a closed form, or PyTorch's own module), and
2. evaluates each named wrong variant (a :class:`Mistake`, the same record the lab checkers use) and
   asserts that the comparison *rejects* it, so a check that could not fail cannot be written.

A reader sees one short line, ``✓ (3.1) softmax weights = double loop``; the difference and the rejected
variants are one click away (a ``<details>`` in the page, a second line in a terminal)::

    max |Δ| below 1e-12 (tolerance 1e-10); rejects: softmax over the queries (misses by 0.61),
    no max subtraction (overflows, as declared)

A wrong variant proves something only when it is a real alternative that runs and misses the claim by a
margin that means something. So :func:`verify` raises ``ValueError`` (naming the variant) when one

* raises, has another shape than the expected value, or is not finite, unless the :class:`Mistake`
  declares that failure as its point (``fails_by="raises"``, ``"shape"``, ``"overflow"``, ``"nan"``);
* is a literal constant (``True``, ``4.0``, ``[1, 1, 1]``, a function that reads nothing), or is computed
  from ``got`` itself: a function that reads the object ``got`` is, or a value equal to ``-got``,
  ``got + c`` or a constant while ``got`` is not (a negation, an offset, ``x - x``); a claim about one
  boolean can only be "rejected" by its negation, so compare the quantities (``relation="<"``) instead;
* misses by less than ``gap`` (relative to the largest ``|expected|``, 1e-3 by default): a variant that
  differs by rounding (a missing scale that a normalisation cancels) shows nothing.

With ``TRANSFORMER_COURSE_VERDICTS`` naming a file, each verdict is also appended to it as one JSON line
(the book build keeps one such log per page; ``tests/test_book.py`` reads them).
"""

from __future__ import annotations

import dis
import html
import json
import math
import os
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["CheckFailed", "Mistake", "Verdict", "bound", "verify"]

RELATIONS = ("==", "<=", ">=", "<", ">")
FAILURES = ("raises", "shape", "overflow", "nan")
MAX_CLAIM = 88  # characters: with "✓ " a verdict reads as one line of about 90
VERDICT_LOG_ENV = "TRANSFORMER_COURSE_VERDICTS"


class CheckFailed(AssertionError):
    """A claim is false, or one of its wrong variants is not rejected (the check cannot fail)."""


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer: ``why`` it is wrong (what the reader or learner is told) and ``wrong``,
    a function that makes the mistake (called with the same inputs as the right answer), or the wrong
    value itself. Used by :func:`verify` in the book and by the labs' exercise checkers.

    ``fails_by`` declares a failure that is the point of the mistake, for :func:`verify`: ``"raises"``
    (the variant cannot run, and the claim is that it cannot), ``"shape"``, ``"overflow"`` (it
    produces inf) or ``"nan"``. Undeclared, such a failure is an error: it proves nothing about the
    claim."""

    why: str
    wrong: Callable[..., Any] | Any
    fails_by: str | None = None

    def __post_init__(self) -> None:
        if self.fails_by is not None and self.fails_by not in FAILURES:
            raise ValueError(f"fails_by must be one of {FAILURES} or None, got {self.fails_by!r}")


@dataclass(frozen=True)
class Verdict:
    """The outcome of :func:`verify`: the claim, the largest difference (or the smallest margin of an
    inequality), its tolerance, and how each wrong variant was rejected."""

    claim: str
    delta: float
    relation: str
    rejected: tuple[tuple[str, str], ...]  # (why, how it was rejected)
    tolerance: str = ""

    @property
    def line(self) -> str:
        """What a reader sees first: ``✓`` and the claim."""
        return f"✓ {self.claim}"

    @property
    def detail(self) -> str:
        """The difference and the rejected variants."""
        if self.relation == "==":
            head = f"max |Δ| {_delta(self.delta)}"
        else:
            head = f"holds with margin {_fmt(self.delta)}"
        if self.tolerance:
            head += f" ({self.tolerance})"
        rejects = ", ".join(f"{why} ({how})" for why, how in self.rejected)
        return f"{head}; rejects: {rejects}"

    def __str__(self) -> str:
        return f"{self.line}\n  {self.detail}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        items = "".join(
            f"<li>{html.escape(why)}: {html.escape(how)}</li>" for why, how in self.rejected
        )
        head = html.escape(self.detail.split("; rejects:")[0])
        return (
            f'<details class="tc-verdict"><summary>{html.escape(self.line)}</summary>'
            f"<p>{head}. Rejects:</p><ul>{items}</ul></details>"
        )

    def _ipython_display_(self) -> None:  # already shown by verify(); show nothing twice
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
    gap: float = 1e-3,
    quiet: bool = False,
) -> Verdict:
    """Check ``got`` against ``expected`` and prove the check can fail; show a one-line verdict.

    Args:
        claim: what is claimed, starting with the equation number as the reader sees it, at most
            88 characters, e.g. ``"(3.1) softmax weights = double loop"``.
        got: the package's result (a tensor, array, number or bool), or a function of ``inputs``.
        expected: the independent evaluation, or a function of ``inputs``.
        mistakes: at least one :class:`Mistake`; each wrong variant must run, keep the expected's
            shape, stay finite (unless its ``fails_by`` says otherwise) and be rejected.
        inputs: positional arguments for whichever of ``got``, ``expected``, ``wrong`` are functions.
        atol, rtol: the comparison's tolerances (``|got - expected| <= atol + rtol |expected|``).
        relation: ``"=="`` (close within tolerance) or an inequality ``got <= expected`` etc.,
            element-wise, with ``atol`` as slack.
        gap: the least miss, relative to the largest ``|expected|`` (or absolute when that is 0), by
            which a wrong variant must miss the claim (for an inequality: violate it).
        quiet: return the verdict without showing it (for tests).

    Raises:
        ValueError: no mistakes, an unknown relation, a claim too long for one line, or a wrong
            variant that proves nothing (see the module's docstring), named.
        CheckFailed: the claim does not hold, or a wrong variant is not rejected.
    """
    if not mistakes:
        raise ValueError(
            f"verify({claim!r}) needs at least one Mistake: a check that rejects no wrong variant "
            "cannot show that it can fail. Add mistakes=[Mistake('what is wrong', wrong_fn)]."
        )
    if relation not in RELATIONS:
        raise ValueError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if len(claim) > MAX_CLAIM:
        _refuse(
            f"the claim {claim!r} has {len(claim)} characters; a verdict is one line, so keep it to "
            f"{MAX_CLAIM} and put the rest in the text around the check"
        )
    exp = _as_tensor(_call(expected, inputs), "expected", claim)
    got_value = _call(got, inputs)
    value = _as_tensor(got_value, "got", claim)
    ok, delta, why_not = _judge(value, exp, relation, atol, rtol)
    if not ok:
        raise CheckFailed(f"✗ {claim}: {why_not}")
    scale = float(exp.abs().max()) if exp.numel() and not exp.dtype == torch.bool else 0.0
    least = gap * (scale if scale > 0 else 1.0)
    rejected = []
    for mistake in mistakes:
        if not isinstance(mistake, Mistake):
            raise ValueError(f"mistakes must be Mistake(why, wrong) records, got {mistake!r}")
        how = _reject(
            claim, mistake, inputs, (got, got_value, value), exp, relation, atol, rtol, least
        )
        rejected.append((mistake.why, how))
    tolerance = f"tolerance {atol:g}" if atol and relation == "==" else ""
    if rtol:
        tolerance = f"{tolerance}, rtol {rtol:g}" if tolerance else f"rtol {rtol:g}"
    verdict = Verdict(claim, float(delta), relation, tuple(rejected), tolerance)
    _log(verdict, mistakes)
    if not quiet:
        _show(verdict)
    return verdict


def _reject(claim, mistake, inputs, got_forms, exp, relation, atol, rtol, least) -> str:
    """How the comparison rejects ``mistake``; raises if the variant proves nothing."""
    name, declared = f"the wrong variant {mistake.why!r} of {claim!r}", mistake.fails_by
    got, got_value, value = got_forms
    if _is_literal(mistake.wrong):
        return _refuse(
            f"{name} is a literal constant; give the computation that makes the mistake (a value "
            "computed by a formula is written as the formula: `lambda: 2 * L * H * d_k`), so that the "
            "check shows what the mistake changes"
        )
    if _reads(mistake.wrong, got, got_value):
        return _refuse(
            f"{name} is computed from `got` itself (it reads the object the claim checks); a variant "
            "must be another way to compute the answer, the one a learner or a source uses"
        )
    try:
        wrong = _as_tensor(_call(mistake.wrong, inputs), "wrong", claim)
    except CheckFailed:
        raise
    except Exception as err:
        if declared == "raises":
            return f"raises {type(err).__name__}, as it should"
        return _refuse(
            f"{name} raises {type(err).__name__}: {err}. A variant that cannot run proves nothing about "
            "the check: write the mistake as it runs, or declare Mistake(..., fails_by='raises') "
            "when raising is the point"
        )
    if declared == "raises":
        return _refuse(f"{name} is declared to raise, but it returned a value")
    if wrong.is_floating_point() and not torch.isfinite(wrong).all():
        kind = "nan" if torch.isnan(wrong).any() else "overflow"
        if declared in ("overflow", "nan"):
            return "overflows, as it should" if kind == "overflow" else "gives NaN, as it should"
        return _refuse(
            f"{name} is not finite ({kind}); declare fails_by={kind!r} if that is the point, or give "
            "a variant that stays finite and misses the claim"
        )
    if declared in ("overflow", "nan"):
        return _refuse(f"{name} is declared to fail by {declared}, but it is finite")
    shape_differs = wrong.shape != exp.shape and (exp.numel() != 1 or relation == "==")
    if shape_differs:
        if declared == "shape":
            return f"shape {tuple(wrong.shape)} instead of {tuple(exp.shape)}, as it should"
        return _refuse(
            f"{name} has shape {tuple(wrong.shape)}, the claim {tuple(exp.shape)}; a variant of "
            "another shape is rejected by the shape alone. Give one with the claim's shape, or "
            "declare fails_by='shape' when the shape is the point"
        )
    if declared == "shape":
        return _refuse(f"{name} is declared to change the shape, but it has the claim's shape")
    trivial = _trivial_of(wrong, value)
    if trivial:
        return _refuse(
            f"{name} is {trivial} of `got`, not another way to compute the answer; give the variant "
            "a learner or a source actually computes"
        )
    w_ok, w_delta, _ = _judge(wrong, exp, relation, atol, rtol)
    if w_ok:
        raise CheckFailed(
            f"✗ {claim}: the wrong variant {mistake.why!r} passes too (Δ {_fmt(w_delta)}), "
            "so this check cannot tell it apart; tighten the tolerance or compare more."
        )
    if wrong.dtype == torch.bool or exp.dtype == torch.bool:
        n = int(w_delta)
        return f"{n} entr{'y differs' if n == 1 else 'ies differ'}"
    miss = w_delta if relation == "==" else -w_delta + 0.0  # + 0.0: no "-0"
    if miss < least:
        return _refuse(
            f"{name} misses the claim by only {_fmt(miss)}, less than the least gap {_fmt(least)} "
            "(verify's gap, relative to the largest |expected|): a difference of rounding shows "
            "nothing. Give a variant that the claim really excludes, or a smaller gap= with a reason"
        )
    return f"misses by {_fmt(miss)}" if relation == "==" else f"violates it by {_fmt(miss)}"


def _refuse(message: str) -> str:
    """Raise ``ValueError(message)``; with ``TRANSFORMER_COURSE_VERIFY_AUDIT`` set (a maintainer's
    survey of every page in one build), record it in the verdict log instead and go on."""
    if os.environ.get("TRANSFORMER_COURSE_VERIFY_AUDIT"):
        _append({"refused": message})
        return "REFUSED"
    raise ValueError(message)


def _is_literal(x: Any) -> bool:
    """A literal constant: a Python number, boolean or list of them, or a function that only builds a
    constant (``lambda: 4.0``, ``lambda: torch.tensor(True)``): it reads no argument and no data, and
    calls nothing but a constructor."""
    if isinstance(x, bool | int | float | complex):
        return True
    if isinstance(x, list | tuple):
        return len(x) > 0 and all(_is_literal(v) for v in x)
    if isinstance(x, types.FunctionType):
        return _only_builds_a_constant(x.__code__, x)
    return False


# What a function that only builds a constant may name: modules, constructors and dtypes.
_CONSTANT_NAMES = {
    "torch",
    "np",
    "numpy",
    "math",
    "tensor",
    "as_tensor",
    "array",
    "asarray",
    "float",
    "int",
    "bool",
    "ones",
    "zeros",
    "full",
    "ones_like",
    "zeros_like",
    "full_like",
    "float64",
    "float32",
    "double",
    "long",
    "bool_",
    "inf",
    "nan",
    "pi",
    "e",
}


def _only_builds_a_constant(code: types.CodeType, fn: types.FunctionType) -> bool:
    args = set(code.co_varnames[: code.co_argcount + code.co_kwonlyargcount])
    for ins in dis.get_instructions(code):
        if ins.opname.startswith("LOAD_FAST") and ins.argval in args:
            return False
        if ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF", "LOAD_CLOSURE"):
            return False
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME", "LOAD_ATTR", "LOAD_METHOD"):
            if ins.argval not in _CONSTANT_NAMES:
                return False
    return all(
        _only_builds_a_constant(c, fn) for c in code.co_consts if isinstance(c, types.CodeType)
    )


def _reads(wrong: Any, *objects: Any) -> bool:
    """Whether the function ``wrong`` reads, by name or closure, one of ``objects`` (``got`` as given,
    or its value)."""
    if not isinstance(wrong, types.FunctionType):
        return False
    ids = {id(o) for o in objects if o is not None and not isinstance(o, bool | int)}
    seen = [c.cell_contents for c in (wrong.__closure__ or ()) if _filled(c)]
    names = _global_names(wrong.__code__)
    seen += [wrong.__globals__[n] for n in names if n in wrong.__globals__]
    return any(id(o) in ids for o in seen)


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True


def _global_names(code: types.CodeType) -> set[str]:
    names = {
        i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def _trivial_of(wrong: Tensor, got: Tensor) -> str | None:
    """``"the negation"``, ``"an offset"`` or ``"a constant"`` when ``wrong`` is one of ``got`` (which
    varies), else ``None``. A scaled ``got`` (a missing scale factor) is a real mistake and passes."""
    if wrong.shape != got.shape or got.numel() < 2:
        if got.dtype == torch.bool and got.numel() == 1 and wrong.numel() == 1:
            return "the negation (one boolean can only be rejected by its negation: compare quantities)"
        return None
    if got.dtype == torch.bool or wrong.dtype == torch.bool:
        g, w = got.to(torch.bool), wrong.to(torch.bool)
        if bool((w == ~g).all()):
            return "the negation"
        if bool((w == w.reshape(-1)[0]).all()) and not bool((g == g.reshape(-1)[0]).all()):
            return "a constant"
        return None
    if got.is_complex() or wrong.is_complex():
        return None
    g, w = got.reshape(-1).double(), wrong.reshape(-1).double()
    if not (torch.isfinite(g).all() and torch.isfinite(w).all()):
        return None
    if float(g.max() - g.min()) <= 1e-6 * float(g.abs().max()):  # got is constant, up to rounding
        return None
    gc = g - g.mean()
    a = float((gc * (w - w.mean())).sum() / (gc * gc).sum())
    b = float(w.mean() - a * g.mean())
    size = float(w.abs().max()) + float(g.abs().max())
    if float((w - (a * g + b)).abs().max()) > 1e-9 * size:
        return None
    if abs(a) <= 1e-9:
        return "a constant"
    if abs(a + 1) <= 1e-9:
        return "the negation"
    if abs(a - 1) <= 1e-9 and abs(b) > 1e-9 * size:
        return "an offset"
    return None


def _show(verdict: Verdict) -> None:
    """In a notebook, the one line with the detail folded under it; elsewhere, two printed lines."""
    try:
        from IPython import get_ipython

        shell = get_ipython()
    except ImportError:
        shell = None
    if shell is not None and getattr(shell, "kernel", None) is not None:
        from IPython.display import display

        display({"text/plain": str(verdict), "text/html": verdict._repr_html_()}, raw=True)
    else:
        print(verdict)


def _log(verdict: Verdict, mistakes: Sequence[Mistake]) -> None:
    _append(
        {
            "claim": verdict.claim,
            "relation": verdict.relation,
            "delta": verdict.delta,
            "rejected": [
                {"why": m.why, "how": how, "fails_by": m.fails_by}
                for m, (_, how) in zip(mistakes, verdict.rejected, strict=True)
            ],
        }
    )


def _append(record: dict) -> None:
    path = os.environ.get(VERDICT_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


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
        bound_ = atol + rtol * exp.abs()
        if torch.isnan(diff).any():
            return False, math.nan, "NaN in the comparison"
        excess = diff - bound_
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


def _delta(x: float) -> str:
    """A difference as the reader sees it: rounding noise as a bound (:func:`bound`)."""
    return bound(x) if x < 1e-8 else _fmt(x)


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
