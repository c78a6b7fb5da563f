"""Exercises with checkers that explain what is wrong, and solutions shown only when asked for.

Used by the labs (``notebooks/``) and the book's exercise pages. A learner writes a function and calls
``tc.exercises.check("notation.row_self_attention", my_function)``. The checker runs it on several
seeded random inputs of different sizes, compares with the reference solution, and when the answer is
wrong says *how*: not attempted, an exception, the wrong type or shape, off by a transpose, NaNs, rows
of attention weights that do not sum to one, or one of the exercise's known mistakes (a missing
``1/sqrt(d_k)`` scale, a softmax over the wrong axis, ...). ``tc.exercises.solution(name)`` prints the
reference solution's source.

Exercises are defined per chapter: ``exercises/X.py`` (or the subpackage ``exercises/X/``, one file per
part of its lab) registers the exercises ``X.*`` of chapter ``X``.
Nothing is imported until an exercise is asked for: :func:`check` and :func:`solution` import the one
chapter module they need, :func:`list_exercises` imports those it lists.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pathlib
import pkgutil
import re
import textwrap
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..checks import Mistake  # one record of a typical wrong answer, shared with the book's checks

__all__ = [
    "ClassExercise",
    "Exercise",
    "Feedback",
    "Mistake",
    "check",
    "exercise",
    "list_exercises",
    "randn",
    "solution",
    "where_raised",
]

_REGISTRY: dict[str, Exercise] = {}
_PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parents[1])
_TORCH_DIR = f"{os.sep}torch{os.sep}"


def where_raised(err: BaseException) -> str:
    """Where the learner's code raised ``err``, as `` (line 12: the line)``: the last frame of its
    traceback outside the course's package and outside PyTorch, so that a crash inside a torch function
    quotes the learner's call, not torch's internals (the last frame when no other is left)."""
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if _PACKAGE_DIR not in f.filename and _TORCH_DIR not in f.filename]
    frame = (mine or frames or [None])[-1]
    return f" (line {frame.lineno}: {frame.line})" if frame is not None else ""


@dataclass(frozen=True)
class Feedback:
    """What a checker found. Truthy only when the answer is correct."""

    exercise: str
    status: str  # "correct", "incorrect", "not attempted" or "error"
    message: str

    def __bool__(self) -> bool:
        return self.status == "correct"

    def __str__(self) -> str:
        icon = {"correct": "✅", "not attempted": "⏳", "error": "💥"}.get(self.status, "❌")
        return f"{icon} {self.exercise}: {self.message}"

    __repr__ = __str__


def randn(gen: torch.Generator, *shape: int) -> Tensor:
    """Standard normal float64 inputs of ``shape`` from ``gen`` (float64 lets checkers be strict)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


@dataclass
class Exercise:
    """One exercise: a reference ``solution``, an input generator, and known mistakes.

    Attributes:
        name: ``"chapter.short_name"``.
        prompt: what to implement (shown by :func:`list_exercises`).
        solution: the reference function.
        make_inputs: ``(generator, trial) -> tuple`` of positional arguments for both functions.
        mistakes: the known :class:`Mistake` s; when the learner's output equals a mistake's output,
            its explanation is the feedback.
        rows_sum_to_one: the output's rows sum to one (attention weights, or a distribution per row).
        rows_of, row_axis: what a row holds and what it runs over, for the messages about rows that
            do not sum to one (attention weights over the keys, or a sampling distribution over the
            vocabulary).
        atol, rtol: tolerances of the comparison (float64 inputs are used, so these are tight).
    """

    name: str
    prompt: str
    solution: Callable[..., Any]
    make_inputs: Callable[[torch.Generator, int], tuple]
    mistakes: list[Mistake] = field(default_factory=list)
    rows_sum_to_one: bool = False
    rows_of: str = "attention weights"
    row_axis: str = "the keys"
    atol: float = 1e-8
    rtol: float = 1e-6
    trials: int = 3

    def check(self, answer: Callable[..., Any] | None) -> Feedback:
        """Run ``answer`` against the solution on ``trials`` seeded inputs and explain the result."""
        if answer is None:
            return self._feedback("not attempted", "pass your function to check(...).")
        if not callable(answer):
            return self._feedback(
                "incorrect",
                f"check() expects your function itself (e.g. check(name, my_fn)), got a "
                f"{type(answer).__name__}.",
            )
        for trial in range(self.trials):
            gen = torch.Generator().manual_seed(1000 + trial)
            args = self.make_inputs(gen, trial)
            expected = self.solution(*args)
            try:
                got = answer(*[a.clone() if isinstance(a, Tensor) else a for a in args])
            except NotImplementedError:
                return self._feedback(
                    "not attempted", "replace `raise NotImplementedError` with your code."
                )
            except Exception as err:  # the learner's bug: report it, never crash the notebook
                return self._feedback(
                    "error", f"your function raised {type(err).__name__}: {err}{where_raised(err)}"
                )
            verdict = self._compare(got, expected, args)
            if verdict is not None:
                return self._feedback("incorrect", f"{verdict} [input sizes: {_sizes(args)}]")
        return self._feedback("correct", f"matches the reference on {self.trials} random inputs.")

    def _feedback(self, status: str, message: str) -> Feedback:
        return Feedback(self.name, status, message)

    def _compare(self, got: Any, expected: Tensor, args: tuple) -> str | None:
        if got is None:
            return "your function returned None; did you forget `return`?"
        if not isinstance(got, Tensor):
            try:
                got = torch.as_tensor(got, dtype=expected.dtype)
            except (TypeError, ValueError, RuntimeError):
                return f"expected a torch.Tensor, got {type(got).__name__}."
            if not isinstance(got, Tensor):
                return f"expected a torch.Tensor, got {type(got).__name__}."
        got = got.detach().to(expected.dtype)
        if got.shape != expected.shape:
            for mistake in self.mistakes:  # a known mistake may change the shape
                if _close(got, torch.as_tensor(mistake.wrong(*args)).to(expected.dtype), self):
                    return mistake.why
            if got.dim() >= 2 and got.mT.shape == expected.shape and _close(got.mT, expected, self):
                return (
                    f"off by a transpose: you returned shape {tuple(got.shape)}, expected "
                    f"{tuple(expected.shape)}; the values are right once transposed."
                )
            return f"wrong shape: expected {tuple(expected.shape)}, got {tuple(got.shape)}."
        if not torch.isfinite(got).all():
            # a known mistake may itself give NaN (e.g. a fully masked row): name it if it matches
            for mistake in self.mistakes:
                wrong = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
                if _close(got, wrong, self, equal_nan=True):
                    return mistake.why
            return "your output contains NaN or inf; look for exp() overflow or a division by zero."
        if _close(got, expected, self):
            return None
        for mistake in self.mistakes:
            if _close(got, torch.as_tensor(mistake.wrong(*args)).to(expected.dtype), self):
                return mistake.why
        if self.rows_sum_to_one:
            row_sums = got.sum(-1)
            if not torch.allclose(row_sums, torch.ones_like(row_sums), atol=1e-6):
                col_sums = got.sum(-2)
                if torch.allclose(col_sums, torch.ones_like(col_sums), atol=1e-6):
                    return (
                        "your columns sum to one but the rows do not: the softmax normalised over "
                        f"the wrong axis (use dim=-1, over {self.row_axis})."
                    )
                return (
                    f"rows of {self.rows_of} must sum to one; yours sum to values between "
                    f"{row_sums.min():.4g} and {row_sums.max():.4g}."
                )
        if got.dim() >= 2 and got.shape == got.mT.shape and _close(got.mT, expected, self):
            return "off by a transpose: the values are right once transposed."
        err = (got.double() - expected.double()).abs()  # also for bool or integer answers
        idx = tuple(
            int(i) for i in np.unravel_index(int(err.argmax()), tuple(err.shape))
        )  # torch>=2.1
        return (
            f"values differ from the reference: largest error {err.max():.3g} at index {idx} "
            f"(you: {got[idx]:.6g}, expected: {expected[idx]:.6g}; tolerance {self.atol:g})."
        )


def _close(a: Tensor, b: Tensor, ex: Exercise, equal_nan: bool = False) -> bool:
    return a.shape == b.shape and torch.allclose(
        a, b.to(a.dtype), atol=ex.atol, rtol=ex.rtol, equal_nan=equal_nan
    )


@dataclass
class ClassExercise(Exercise):
    """An exercise whose answer is a class the checker builds itself (or, with ``kind="function"``, a
    function it calls on fixed cases): the multi-head layer, the capstone GPT, the Seq2Seq and the ViT.

    :meth:`check` does what all of them share: it asks for the class itself, not an instance or
    another object, naming ``example`` (the class the lab defines); it runs the learner's code on one
    torch thread (tiny models: fastest, most of all on a busy CPU) and inside a forked random state,
    so building layers never moves the lab's seed; and a ``NotImplementedError`` means "not
    attempted". Each subclass compares the answer with the package in :meth:`_check_answer`.
    """

    kind: str = "class"  # what check() expects: "class" or "function"
    example: str = ""  # the name of the learner's class in the lab, for the messages

    def check(self, answer: Any) -> Feedback:
        if answer is None:
            return self._feedback("not attempted", f"pass your {self.kind} to check(...).")
        example = self.example or self.solution.__name__
        if self.kind == "class" and isinstance(answer, torch.nn.Module):
            return self._feedback(
                "incorrect",
                f"pass the class itself, check({self.name!r}, {example}), not an instance: the "
                "checker builds it for several configurations.",
            )
        if not callable(answer):
            return self._feedback(
                "incorrect",
                f"check() expects your {self.kind} itself (e.g. check({self.name!r}, {example})), "
                f"got a {type(answer).__name__}.",
            )
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.random.fork_rng(devices=[]):
                return self._check_answer(answer)
        except NotImplementedError:
            return self._feedback(
                "not attempted", "replace `raise NotImplementedError` with your code."
            )
        finally:
            torch.set_num_threads(threads)

    def _check_answer(self, answer: Any) -> Feedback:
        raise NotImplementedError(f"{type(self).__name__} must define _check_answer")


def _sizes(args: tuple) -> str:
    def short(a: Any) -> str:
        if isinstance(a, Tensor):
            return str(tuple(a.shape))
        text = repr(a)
        if len(text) <= 40:
            return text
        if callable(a):  # a module or function: its name, not its whole repr
            return f"<{getattr(a, '__name__', type(a).__name__)}>"
        return text[:37] + "..."

    return ", ".join(short(a) for a in args)


def exercise(**kwargs: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: register the decorated function as the solution of a new :class:`Exercise`."""

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        ex = Exercise(solution=fn, **kwargs)
        if ex.name in _REGISTRY:
            raise ValueError(f"exercise {ex.name!r} is defined twice")
        _REGISTRY[ex.name] = ex
        return fn

    return register


def _chapters() -> list[str]:
    """The chapter modules of this package, e.g. ``["attention", "block", ...]``."""
    return sorted(info.name for info in pkgutil.iter_modules(__path__))


def _load(chapter: str) -> None:
    """Import ``exercises/<chapter>.py``, which registers its exercises (once)."""
    if chapter in _chapters():
        importlib.import_module(f"{__name__}.{chapter}")


def _get(name: str) -> Exercise:
    _load(name.split(".", 1)[0])
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(list_exercises())
        raise KeyError(f"no exercise named {name!r}; known exercises: {known}") from None


def check(name: str, answer: Callable[..., Any] | None) -> Feedback:
    """Check the learner's function ``answer`` for exercise ``name``; returns a :class:`Feedback`."""
    return _get(name).check(answer)


def solution(name: str) -> str:
    """Return (and print) the source of the reference solution of exercise ``name``, after the sources
    of the helpers it calls that the learner writes too (an exercise's ``helpers``, if any)."""
    ex = _get(name)
    sources = []
    for obj in (*getattr(ex, "helpers", ()), ex.solution):
        src = textwrap.dedent(inspect.getsource(obj))
        sources.append(src[re.search(r"^(def|class) ", src, flags=re.M).start() :])  # no @exercise
    src = "\n\n".join(sources)
    print(src)
    return src


def list_exercises(prefix: str = "") -> list[str]:
    """Names of the exercises starting with ``prefix`` (e.g. ``"notation."``), importing the chapter
    modules that may hold them."""
    for chapter in _chapters():
        if chapter.startswith(prefix.split(".", 1)[0]):
            _load(chapter)
    return sorted(n for n in _REGISTRY if n.startswith(prefix))
