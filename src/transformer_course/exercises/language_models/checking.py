"""The capstone's checkers (lab 7): the lab's parameter names, the checkers' weights, and
:class:`CapstoneExercise`, which every part of the GPT is checked with.

The learner's parts have the names of ``scratch/gpt.py`` (``embed.tok_emb``, ``blocks.0.attn.W_q``,
...). A model checker builds the package's :class:`~transformer_course.language_models.GPT` with
seeded weights (:func:`package_gpt`), loads them into the learner's module under the lab's names
(:func:`lab_names`, :func:`lab_state_dict`: the package's fused ``in_proj`` split into ``W_q, W_k,
W_v``), compares the outputs in float64 and, when they differ, names the typical mistake that explains
the difference: each :class:`Mistake` is a wrong model built from the same weights. When no single
mistake explains it, the checker says which part departs from the package (``locate``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
from torch import Tensor, nn

from ...checks import bound
from ...language_models import GPT as PackageGPT
from ...language_models import GPTConfig, scratch_names, scratch_state_dict
from ...scratch import gpt as scratch
from .. import _REGISTRY, ClassExercise, Mistake, randn, where_raised

__all__ = [
    "CapstoneExercise",
    "lab_names",
    "lab_state_dict",
    "package_gpt",
    "parameter_table",
]

# --------------------------------------------------------------------------------------------------
# The lab's parameter names and the checkers' weights


def lab_names(package_name: str) -> tuple[str, ...]:
    """The lab's names for a parameter of the package's GPT: one name, e.g.
    ``stack.blocks.0.mlp.fc1.weight`` -> ``blocks.0.mlp.0.weight``, or three for the fused
    ``in_proj``, whose ``3D`` rows stack ``W_q, W_k, W_v`` (each stored ``(D, D)`` by ``nn.Linear``):
    ``stack.blocks.0.attn.in_proj.weight`` -> ``blocks.0.attn.W_q.weight``, ``...W_k.weight``,
    ``...W_v.weight``.

    The lab's names are those of ``scratch/gpt.py``, which the capstone's skeletons prescribe; the
    checkers load the package's weights into the learner's model by them. The map is the package's
    one, :func:`~transformer_course.language_models.scratch_names` (seven renames and the split of
    ``attn.in_proj.``).
    """
    return scratch_names(package_name)


def lab_state_dict(model: PackageGPT) -> dict[str, Tensor]:
    """The package GPT's weights under the lab's names, ``in_proj`` split in three (a tied head
    appears under both of its names): the package's
    :func:`~transformer_course.language_models.scratch_state_dict`."""
    return scratch_state_dict(model)


def parameter_table(config: GPTConfig) -> str:
    """The lab's parameter names with their shapes and where each lives in the package's GPT, for
    ``config`` (block 0 stands for every block), in the order of ``scratch/gpt.py``; returned as text."""
    with torch.random.fork_rng(devices=[]):
        package, ours = PackageGPT(config), scratch.GPT(config)
    where = {}
    for name, t in package.state_dict().items():
        names = lab_names(name)
        n = t.shape[0] // len(names)
        for k, lab in enumerate(names):
            where[lab] = name if len(names) == 1 else f"{name}[{k * n}:{(k + 1) * n}]"
    rows = [("your parameter", "shape", "the package's GPT"), ("", "", "")]
    for name, t in ours.state_dict().items():
        if not name.startswith("blocks.") or name.startswith("blocks.0."):
            rows.append((name, str(tuple(t.shape)), where[name]))
    widths = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines[1] = "  ".join("-" * w for w in widths)
    return "\n".join(line.rstrip() for line in lines)


@lru_cache(maxsize=8)
def package_gpt(config: GPTConfig, seed: int = 0) -> PackageGPT:
    """The package's GPT in float64 with the checkers' weights, drawn from ``seed``.

    Every weight matrix is drawn from N(0, 1/fan_in), the embedding tables from N(0, 1), the LayerNorm
    gains from 1 + N(0, 0.2^2) and every bias from N(0, 0.2^2). At the GPT-2-style initialisation
    (N(0, 0.02^2)) attention is nearly uniform and several mistakes (a missing scale, the softmax's
    axis) would change the logits by less than a tolerance; at this scale each one changes them
    clearly. The global random state is left as it was. Do not modify the returned model (it is
    shared between calls).
    """
    with torch.random.fork_rng(devices=[]):
        model = PackageGPT(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied head is listed once, as tok_emb.weight
            if "emb" in name:
                p.copy_(randn(g, *p.shape))
            elif p.dim() == 2:
                p.copy_(randn(g, *p.shape) / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * randn(g, *p.shape))
            else:
                p.copy_(0.2 * randn(g, *p.shape))
    return model


def _part(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    """The entries of ``state`` under ``prefix``, with the prefix removed (one part's weights)."""
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


# two sizes, every dimension different (V, C, D, d_k), so that transposes and hard-coded sizes show
_CONFIGS = (
    GPTConfig(vocab_size=13, block_size=10, n_layers=2, H=3, d_model=12, dropout=0.0),
    GPTConfig(vocab_size=9, block_size=7, n_layers=1, H=2, d_model=10, dropout=0.0),
)


def _sizes_of(config: GPTConfig) -> str:
    c = config
    return f"V={c.vocab_size}, C={c.block_size}, L={c.n_layers}, H={c.H}, D={c.d_model}"


def _variant(base: type, name: str, **attrs: Any) -> type:
    """A subclass of ``base`` with some class attributes changed: one typical mistake."""
    return type(name, (base,), attrs)


# --------------------------------------------------------------------------------------------------
# The checkers' machinery

Output = dict[str, Tensor]


class _Verdict(Exception):
    """Raised while observing an answer: what is wrong with it, in words."""


def _no_random_inputs(gen: torch.Generator, trial: int) -> tuple:
    raise TypeError(
        "capstone exercises run fixed cases (CapstoneExercise.cases), not random inputs"
    )


def _outcome(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or the exception it raised (``NotImplementedError`` and verdicts pass through)."""
    try:
        return fn(*args)
    except (NotImplementedError, _Verdict):
        raise
    except Exception as err:  # the learner's bug (or a mistake's): compared, reported, never raised
        return err


def _same(a: Any, b: Any, atol: float, rtol: float) -> bool:
    """Two outputs agree: the same error, or the same tensors (NaN where the other has NaN: a mistake
    that leaves a query without keys is named by its NaNs)."""
    if isinstance(a, BaseException) or isinstance(b, BaseException):
        return type(a) is type(b) and str(a) == str(b)
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape
        and torch.allclose(a[k].double(), b[k].double(), atol=atol, rtol=rtol, equal_nan=True)
        for k in a
    )


def _max_error(a: Output, b: Output) -> float:
    errs = [(a[k].double() - b[k].double()).abs().max().item() for k in a if a[k].numel()]
    return max(errs, default=0.0)


def _difference(got: Output, expected: Output, atol: float) -> str:
    for key, exp in expected.items():
        mine = got[key]
        if mine.shape != exp.shape:
            return f"{key}: shape {tuple(mine.shape)}, expected {tuple(exp.shape)}."
        if mine.is_floating_point() and not torch.isfinite(mine).all():
            return (
                f"{key}: NaN or inf. Look for a row of scores that is -inf everywhere: a query left "
                "with no key to attend to (its softmax divides 0 by 0)."
            )
        if not mine.is_floating_point() and not torch.equal(mine, exp):
            idx = tuple(int(j) for j in (mine != exp).nonzero()[0])
            return (
                f"{key}: the first difference is at index {idx}: you {mine[idx].item()}, expected "
                f"{exp[idx].item()}."
            )
        err = (mine.double() - exp.double()).abs()
        if err.numel() and err.max() > atol:
            i = int(err.argmax())
            idx = tuple(int(j) for j in torch.unravel_index(torch.tensor(i), err.shape))
            return (
                f"{key}: largest error {err.max():.3g} at index {idx} (you: {mine[idx].item():.6g}, "
                f"expected: {exp[idx].item():.6g})."
            )
    return "the outputs differ."


def _raised(err: BaseException, kind: str) -> str:
    """The learner's error, quoting the line of their code that raised it (not torch's)."""
    return f"your {kind} raised {type(err).__name__}: {err}{where_raised(err)}"


def _tensor(x: Any, what: str) -> Tensor:
    if isinstance(x, Tensor):
        return x.detach()
    try:
        return torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError):
        raise _Verdict(f"{what} must return a tensor, got a {type(x).__name__}.") from None


@dataclass
class CapstoneExercise(ClassExercise):
    """An exercise of the capstone: the answer is a class or a function with a fixed interface, run on
    fixed cases.

    ``observe(answer, case)`` runs the answer and returns what it produced, ``{what: tensor}``; it may
    raise :class:`_Verdict` for what it can tell directly (parameter names, a head that is not tied, a
    batch that ignores its generator). The result is compared with ``expected(case)`` (by default the
    reference solution observed the same way; for the models, the package's GPT). A difference is
    explained by the first :class:`Mistake` whose wrong answer (a class or function) is observed to give
    the same output, or to raise the same error; otherwise by ``locate(answer, case)``, which says where
    the answer departs, and failing that by the largest difference. An error no mistake explains is
    quoted at the learner's line, followed by ``advice(error, case)`` when that has something to say.
    Once every case agrees, ``then(answer)`` may still name a property the cases cannot see (a GPT's
    initialisation).

    ``trials`` is 0 because these checkers do not draw the random inputs of :class:`Exercise`
    (``make_inputs``); ``tests/test_lab_capstone.py`` proves case by case that each mistake differs from
    the solution and is named. ``helpers`` are what :func:`~transformer_course.exercises.solution`
    prints before the solution (the parts it calls that the learner writes in the same step);
    ``registered_by`` is the module that registers the exercise (its solution may live elsewhere,
    e.g. in ``scratch/gpt.py``).
    """

    make_inputs: Callable[[torch.Generator, int], tuple] = _no_random_inputs
    trials: int = 0
    cases: Callable[[], list] = list
    observe: Callable[[Any, Any], Output] | None = None
    expected: Callable[[Any], Output] | None = None
    locate: Callable[[Any, Any], str | None] | None = None
    advice: Callable[[BaseException, Any], str | None] | None = None
    then: Callable[[Any], str | None] | None = None
    describe: Callable[[Any], str] = str
    passed: str = "matches the package"
    helpers: tuple = ()
    registered_by: str = ""

    def _check_answer(self, answer: Any) -> Any:
        cases, worst, floating = self.cases(), 0.0, False
        for case in cases:
            where = f" [{self.describe(case)}]"
            try:
                got = _outcome(self.observe, answer, case)
            except _Verdict as verdict:
                return self._feedback("incorrect", f"{verdict}{where}")
            expected = self.expected(case) if self.expected else self.observe(self.solution, case)
            if not isinstance(got, BaseException) and _same(got, expected, self.atol, self.rtol):
                worst = max(worst, _max_error(got, expected))
                floating |= any(v.is_floating_point() for v in expected.values())
                continue
            why = self._which_mistake(got, case)
            if why is not None:
                return self._feedback("incorrect", f"{why}{where}")
            if isinstance(got, BaseException):
                more = self.advice(got, case) if self.advice else None
                more = f" {more}" if more else ""
                return self._feedback("error", f"{_raised(got, self.kind)}{more}{where}")
            try:
                hint = _outcome(self.locate, answer, case) if self.locate else None
            except _Verdict as verdict:
                hint = str(verdict)
            hint = hint if isinstance(hint, str) else _difference(got, expected, self.atol)
            return self._feedback("incorrect", f"{hint}{where}")
        if self.then is not None:
            why = _outcome(self.then, answer)
            if isinstance(why, BaseException):
                return self._feedback("error", _raised(why, self.kind))
            if why:
                return self._feedback("incorrect", why)
        detail = f" (largest difference {bound(worst)})" if floating else ""
        n = len(cases)
        return self._feedback("correct", f"{self.passed} on {n} case{'s' * (n != 1)}{detail}.")

    def _which_mistake(self, got: Any, case: Any) -> str | None:
        for mistake in self.mistakes:
            try:
                wrong = _outcome(self.observe, mistake.wrong, case)
            except _Verdict:
                continue
            if _same(got, wrong, self.atol, self.rtol):
                return mistake.why
        return None


def _register(ex: CapstoneExercise) -> None:
    if ex.name in _REGISTRY:
        raise ValueError(f"exercise {ex.name!r} is defined twice")
    _REGISTRY[ex.name] = ex


WHY_TRANSPOSED = (
    "it is transposed: nn.Linear(in_features, out_features) stores its weight as (out_features, "
    "in_features) and computes X @ weight.T (the head is nn.Linear(D, V, bias=False))."
)


def _build(answer: Any, config: GPTConfig, state: dict[str, Tensor], what: str) -> nn.Module:
    """``answer(config)`` in float64 and evaluation mode, with the package's weights ``state`` loaded by
    name; raises a verdict when the names or shapes do not fit."""
    module = answer(config)
    if not isinstance(module, nn.Module):
        raise _Verdict(
            f"{what}(config) built a {type(module).__name__}, not an nn.Module (subclass nn.Module and "
            "call super().__init__() first)."
        )
    module = module.double().eval()
    own = dict(module.named_parameters(remove_duplicate=False))
    missing = [k for k in state if k not in own]
    extra = [k for k in own if k not in state]
    if missing or extra:
        said = []
        if missing:
            said.append(f"it has no parameter {_names(missing)}")
        if extra:
            said.append(f"it has parameters the package's model does not: {_names(extra)}")
        raise _Verdict(
            f"your {what}'s parameters do not have the lab's names: {'; '.join(said)}. The checker "
            f"loads the package's weights by name: {what} holds exactly {_names(list(state))}."
        )
    for k, t in state.items():
        if own[k].shape != t.shape:
            if tuple(own[k].shape) == tuple(t.shape)[::-1]:
                raise _Verdict(
                    f"`{k}` has shape {tuple(own[k].shape)} but the package's is {tuple(t.shape)}: "
                    + WHY_TRANSPOSED
                )
            raise _Verdict(
                f"`{k}` has shape {tuple(own[k].shape)} but the package's is {tuple(t.shape)} (see "
                "the table of names and shapes)."
            )
    module.load_state_dict(state, strict=False)  # every parameter is in state; buffers are kept
    return module


def _names(names: list[str], most: int = 8) -> str:
    shown = ", ".join(f"`{n}`" for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _diagnose(got: Tensor, mistakes: list[Mistake], run: Callable[[type], Tensor]) -> str | None:
    """The ``why`` of the first mistake whose part, run on the same input, gives ``got``."""
    for mistake in mistakes:
        try:
            wrong = _outcome(run, mistake.wrong)
        except _Verdict:
            continue
        if (
            isinstance(wrong, Tensor)
            and wrong.shape == got.shape
            and torch.allclose(wrong, got, equal_nan=True)
        ):
            return mistake.why
    return None


def _close(a: Tensor, b: Tensor) -> bool:
    """The checkers' tolerance for one part's output against the package's."""
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6, rtol=1e-6)
