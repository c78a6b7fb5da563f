"""Exercises of the *Autoregressive language models* lab (Lab 7, the capstone).

Two kinds:

* small functions checked on random inputs, as in every lab: the causal mask in MIT's and Turner's
  conventions, the temperature and top-k sampling distributions, the teacher-forcing loss;
* **the capstone**: the learner writes a GPT against fixed interfaces (the pattern of Stanford's
  CS336, assignment 1): ``Embedding``, ``CausalSelfAttention``, ``Block``, ``GPT``, ``get_batch``,
  ``train_loop``, ``generate``, ``KVCache`` and ``generate_cached``. The model checkers build the
  package's :class:`~transformer_course.language_models.GPT` with seeded weights
  (:func:`package_gpt`), load them into the learner's module under the lab's parameter names
  (:func:`lab_name`, :func:`parameter_table`), compare the outputs in float64 and, when they differ,
  name the typical mistake that explains the difference: each :class:`Mistake` is a wrong model built
  from the same weights (post-norm blocks, no causal mask, positions off by one, ...). When no single
  mistake explains it, the checker says which part departs from the package (the embedding, block
  ``l``'s attention, the final norm, ...).

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1 and footnotes 20-22; MIT 6.390 sec.
9.5.2; Dramko 2025 sec. 5.2-5.3; Karpathy 2023, *Let's build GPT*). Inputs are float64 so the checkers
can use tight tolerances. Every answer of the small exercises is finite (the checker rejects NaN and
inf), so the mask exercises return masked attention weights rather than a matrix holding -inf.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import pathlib
import re
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import bound
from ..language_models import GPT as PackageGPT
from ..language_models import GPTConfig, LMRecipe
from ..language_models import generate as package_generate
from ..train import TrainConfig, lr_at, train
from . import _REGISTRY, ClassExercise, Mistake, exercise, randn


def _scores(gen: torch.Generator, *shape: int) -> Tensor:
    """Random scores or logits with a spread of 2 (so that softmax weights differ clearly)."""
    return 2.0 * randn(gen, *shape)


def _additive(keep: Tensor) -> Tensor:
    """0 where ``keep`` is True, -inf elsewhere (MIT's form of a mask)."""
    return torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))


# --------------------------------------------------------------------------------------------------
# 1. MIT's additive causal mask on row-normalised scores (MIT 6.390 sec. 9.5.2)


def _row_scores(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    B, N = ((2, 5), (3, 7), (1, 4))[trial % 3]
    return (_scores(gen, B, N, N),)


@exercise(
    name="language_models.mit_causal_weights",
    prompt=(
        "S is a (B, N, N) tensor of row-form scores, S[b, n, m] = q_n . k_m / sqrt(d_k). Build MIT's "
        "additive causal mask M (N, N): M[n, m] = 0 where key m may be seen by query n (m <= n) and "
        "-inf where it may not (m > n). Return A = softmax(S + M) over each row, shape (B, N, N)."
    ),
    make_inputs=_row_scores,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "your mask lets each query see the future (keys m > n) and hides the past: the keys a "
            "query may see form the lower triangle (torch.tril, not triu), so MIT's M is 0 on and "
            "below the diagonal and -inf strictly above it.",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape[-2:]).bool().triu()), dim=-1),
        ),
        Mistake(
            "you multiplied the scores by a 0/1 mask: a score of 0 still gets weight exp(0) > 0. "
            "Add -inf to the masked scores instead (exp(-inf) = 0).",
            lambda S: torch.softmax(S * torch.ones(S.shape[-2:]).tril(), dim=-1),
        ),
        Mistake(
            "you zeroed the weights after the softmax, so rows no longer sum to one; add M to the "
            "scores before the softmax.",
            lambda S: torch.softmax(S, dim=-1) * torch.ones(S.shape[-2:]).tril(),
        ),
    ],
)
def mit_causal_weights(S: Tensor) -> Tensor:
    N = S.shape[-1]
    keep = torch.ones(N, N, dtype=torch.bool).tril()  # (N, N): key m <= query n
    M = torch.zeros(N, N, dtype=S.dtype).masked_fill(~keep, float("-inf"))  # MIT's additive mask
    return torch.softmax(S + M, dim=-1)  # (B, N, N), rows sum to one


# --------------------------------------------------------------------------------------------------
# 2. The same mask in Turner's column convention (Turner 2023 sec. 4.1)


def _column_scores(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    N = (5, 7, 4)[trial % 3]
    return (_scores(gen, N, N),)


@exercise(
    name="language_models.turner_causal_weights",
    prompt=(
        "S_cols is Turner's (N, N) score matrix, S_cols[n', n] = k_{n'} . q_n (key n' first, query n "
        "second). Return his causal attention matrix A_cols (N, N): each column n is a softmax over "
        "n' restricted to n' <= n, so A_cols[n', n] = 0 for n' > n (upper triangular) and every "
        "column sums to one."
    ),
    make_inputs=_column_scores,
    mistakes=[
        Mistake(
            "you kept the row form's lower-triangular pattern on Turner's [n', n] indices, so "
            "column n sees the future (n' >= n). Turner's matrix is the transpose: keep the upper "
            "triangle (n' <= n).",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape).bool().tril()), dim=0),
        ),
        Mistake(
            "you normalised the rows (dim=1); in Turner's convention each column n sums to one over "
            "the keys n' (dim=0).",
            lambda S: torch.softmax(S + _additive(torch.ones(S.shape).bool().triu()), dim=1),
        ),
    ],
)
def turner_causal_weights(S_cols: Tensor) -> Tensor:
    N = S_cols.shape[0]
    keep = torch.ones(N, N, dtype=torch.bool).triu()  # [n', n]: key n' <= query n
    M_cols = torch.zeros(N, N, dtype=S_cols.dtype).masked_fill(~keep, float("-inf"))  # = M.T
    return torch.softmax(S_cols + M_cols, dim=0)  # (N, N), columns sum to one


# --------------------------------------------------------------------------------------------------
# 3. The temperature softmax


def _temperature_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, float]:
    B, V, tau = ((3, 10, 0.5), (2, 17, 2.0), (4, 8, 0.7))[trial % 3]
    return _scores(gen, B, V), tau


@exercise(
    name="language_models.temperature_probs",
    prompt=(
        "z is a (B, V) tensor of logits (one row per sequence, one column per vocabulary entry) and "
        "tau > 0 a temperature. Return the sampling distribution softmax(z / tau) over the "
        "vocabulary, shape (B, V); each row sums to one."
    ),
    make_inputs=_temperature_inputs,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "you multiplied the logits by tau (or raised the probabilities to the power tau); the "
            "logits are divided by the temperature, softmax(z / tau), so tau < 1 sharpens the "
            "distribution.",
            lambda z, tau: torch.softmax(z * tau, dim=-1),
        ),
        Mistake(
            "you divided the probabilities by tau after the softmax, so the rows no longer sum to one; "
            "divide the logits before the softmax.",
            lambda z, tau: torch.softmax(z, dim=-1) / tau,
        ),
        Mistake(
            "the temperature is missing: you returned softmax(z).",
            lambda z, tau: torch.softmax(z, dim=-1),
        ),
    ],
)
def temperature_probs(z: Tensor, tau: float) -> Tensor:
    return torch.softmax(z / tau, dim=-1)  # (B, V): the same as p**(1/tau), renormalised


# --------------------------------------------------------------------------------------------------
# 4. Top-k filtering


def _top_k_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, V, k = ((3, 10, 3), (2, 12, 5), (4, 7, 1))[trial % 3]
    return _scores(gen, B, V), k  # continuous random logits: no ties


def _keep_top(z: Tensor, k: int, largest: bool = True) -> Tensor:
    idx = torch.topk(z, k, dim=-1, largest=largest).indices  # (B, k)
    return torch.zeros_like(z, dtype=torch.bool).scatter(-1, idx, True)  # (B, V)


@exercise(
    name="language_models.top_k_probs",
    prompt=(
        "z is a (B, V) tensor of logits without ties and k >= 1. Return the top-k sampling "
        "distribution (B, V): the softmax over the k largest logits of each row, and exactly 0 for "
        "every other vocabulary entry; each row sums to one. (With ties, tc.language_models.next_token keeps "
        "every logit equal to the k-th largest.)"
    ),
    make_inputs=_top_k_inputs,
    rows_sum_to_one=True,
    mistakes=[
        Mistake(
            "you kept k + 1 tokens: the k-th largest logit is the last one kept (e.g. use z >= kth, "
            "not z > kth, with kth = torch.topk(z, k).values[..., -1:]).",
            lambda z, k: torch.softmax(
                z.masked_fill(~_keep_top(z, min(k + 1, z.shape[-1])), float("-inf")), dim=-1
            ),
        ),
        Mistake(
            "you did not renormalise: after zeroing all but the top k probabilities, divide by their "
            "sum (or mask the logits with -inf before the softmax).",
            lambda z, k: torch.softmax(z, dim=-1) * _keep_top(z, k),
        ),
        Mistake(
            "you kept the k smallest logits; keep the k largest (torch.topk's default, largest=True).",
            lambda z, k: torch.softmax(
                z.masked_fill(~_keep_top(z, k, largest=False), float("-inf")), dim=-1
            ),
        ),
    ],
)
def top_k_probs(z: Tensor, k: int) -> Tensor:
    kth = torch.topk(z, k, dim=-1).values[..., -1:]  # (B, 1): the k-th largest logit
    z = z.masked_fill(z < kth, float("-inf"))  # drop everything below it
    return torch.softmax(z, dim=-1)  # (B, V); zeroing probabilities and renormalising is the same


# --------------------------------------------------------------------------------------------------
# 5. The teacher-forcing loss (Williams & Zipser 1989; Dramko 2025 sec. 5.2.1)


def _teacher_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    B, N, V = ((2, 5, 7), (3, 4, 11), (1, 8, 5))[trial % 3]
    logits = _scores(gen, B, N, V)
    tokens = torch.randint(0, V, (B, N + 1), generator=gen)
    return logits, tokens


def _nll(logits: Tensor, targets: Tensor) -> Tensor:
    """-log p of each target, (B, N)."""
    return -torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]


@exercise(
    name="language_models.teacher_forcing_loss",
    prompt=(
        "tokens is a (B, N + 1) tensor of token ids; logits is (B, N, V), where logits[b, n] is the "
        "model's prediction after reading tokens[b, 0..n] (one forward pass over tokens[:, :N]). "
        "Return the teacher-forcing loss: the mean over all B * N predictions of "
        "-log softmax(logits[b, n])[tokens[b, n + 1]], a scalar tensor."
    ),
    make_inputs=_teacher_inputs,
    mistakes=[
        Mistake(
            "your targets are not shifted: the prediction at position n is scored against tokens[:, n] "
            "(the token it has just read) instead of the next one, tokens[:, n + 1].",
            lambda logits, tokens: _nll(logits, tokens[:, :-1]).mean(),
        ),
        Mistake(
            "you averaged over the batch only (summing over the N positions); the loss is the mean "
            "over all B * N predictions.",
            lambda logits, tokens: _nll(logits, tokens[:, 1:]).sum(dim=1).mean(),
        ),
        Mistake(
            "the softmax ran over the positions (dim=1) instead of the vocabulary (dim=-1).",
            lambda logits, tokens: (
                -torch.log_softmax(logits, dim=1).gather(-1, tokens[:, 1:, None]).mean()
            ),
        ),
    ],
)
def teacher_forcing_loss(logits: Tensor, tokens: Tensor) -> Tensor:
    B, N, V = logits.shape
    targets = tokens[:, 1:]  # (B, N): the next token after each position
    return F.cross_entropy(logits.reshape(B * N, V), targets.reshape(B * N))  # mean over B * N


# ==================================================================================================
# The capstone: write a GPT (Lab 7)
#
# The learner writes each part against a fixed interface; the parameter names are fixed too, so that
# the checkers can load the package's weights into the learner's model. The reference solutions below
# are what tc.exercises.solution(name) prints; the wrong variants after each one are the typical
# mistakes, each a small subclass that changes one thing.

# --------------------------------------------------------------------------------------------------
# The lab's parameter names and the checkers' weights

_RENAMES = (
    (r"^tok_emb\.", "embed.tok_emb."),
    (r"^pos_emb\.table\.", "embed.pos_emb."),
    (r"^stack\.final_norm\.", "final_norm."),
    (r"^stack\.blocks\.", "blocks."),
    (r"\.mlp\.fc1\.", ".mlp.0."),
    (r"\.mlp\.fc2\.", ".mlp.2."),
)


def lab_name(package_name: str) -> str:
    """The lab's name for a parameter of the package's GPT, e.g. ``stack.blocks.0.mlp.fc1.weight`` ->
    ``blocks.0.mlp.0.weight``.

    The capstone's skeletons prescribe these names; the checkers load the package's weights into the
    learner's model by them. Six renames: ``tok_emb.`` -> ``embed.tok_emb.``, ``pos_emb.table.`` ->
    ``embed.pos_emb.``, ``stack.final_norm.`` -> ``final_norm.``, ``stack.blocks.`` -> ``blocks.``,
    ``mlp.fc1.`` -> ``mlp.0.`` and ``mlp.fc2.`` -> ``mlp.2.`` (the MLP is an ``nn.Sequential``).
    """
    for pattern, replacement in _RENAMES:
        package_name = re.sub(pattern, replacement, package_name)
    return package_name


def lab_state_dict(model: PackageGPT) -> dict[str, Tensor]:
    """The package GPT's weights under the lab's names (a tied head appears under both names)."""
    return {lab_name(name): t for name, t in model.state_dict().items()}


def parameter_table(config: GPTConfig) -> str:
    """The lab's parameter names with their shapes and the package's names, for ``config`` (block 0
    stands for every block); returned as text."""
    with torch.random.fork_rng(devices=[]):
        model = PackageGPT(config)
    rows = [("your parameter", "shape", "the package's GPT"), ("", "", "")]
    for name, t in model.state_dict().items():
        if ".blocks." in name and ".blocks.0." not in name:
            continue
        rows.append((lab_name(name), str(tuple(t.shape)), name))
    widths = [max(len(r[k]) for r in rows) for k in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines[1] = "  ".join("-" * w for w in widths)
    return "\n".join(line.rstrip() for line in lines)


@lru_cache(maxsize=8)
def package_gpt(config: GPTConfig, seed: int = 0) -> PackageGPT:
    """The package's GPT in float64 with the checkers' weights, drawn from ``seed``.

    Every weight matrix is drawn from N(0, 1/fan_in), the embedding tables from N(0, 1), the LayerNorm
    gains from 1 + N(0, 0.2^2) and every bias from N(0, 0.2^2). At GPT-2's initialisation (N(0, 0.02))
    attention is nearly uniform and several mistakes (a missing scale, the softmax's axis) would change
    the logits by less than a tolerance; at this scale each one changes them clearly. The global random
    state is left as it was. Do not modify the returned model (it is shared between calls).
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


# --------------------------------------------------------------------------------------------------
# The checkers' machinery

Output = dict[str, Tensor]
_PACKAGE_DIR = str(pathlib.Path(__file__).resolve().parents[1])


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
    if isinstance(a, BaseException) or isinstance(b, BaseException):
        return type(a) is type(b) and str(a) == str(b)
    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape
        and torch.allclose(a[k].double(), b[k].double(), atol=atol, rtol=rtol, equal_nan=False)
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
            return f"{key}: NaN or inf; look for a row of scores that is -inf everywhere."
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
    frames = traceback.extract_tb(err.__traceback__)
    mine = [f for f in frames if _PACKAGE_DIR not in f.filename and "/torch/" not in f.filename]
    frame = (mine or frames or [None])[-1]
    where = f" (line {frame.lineno}: {frame.line})" if frame is not None else ""
    return f"your {kind} raised {type(err).__name__}: {err}{where}"


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
    the answer departs, and failing that by the largest difference.

    ``trials`` is 0 because these checkers do not draw the random inputs of :class:`Exercise`
    (``make_inputs``); ``tests/test_lab_capstone.py`` proves case by case that each mistake differs from
    the solution and is named.
    """

    make_inputs: Callable[[torch.Generator, int], tuple] = _no_random_inputs
    trials: int = 0
    cases: Callable[[], list] = list
    observe: Callable[[Any, Any], Output] | None = None
    expected: Callable[[Any], Output] | None = None
    locate: Callable[[Any, Any], str | None] | None = None
    describe: Callable[[Any], str] = str
    passed: str = "matches the package"

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
                return self._feedback("error", _raised(got, self.kind) + where)
            try:
                hint = _outcome(self.locate, answer, case) if self.locate else None
            except _Verdict as verdict:
                hint = str(verdict)
            hint = hint if isinstance(hint, str) else _difference(got, expected, self.atol)
            return self._feedback("incorrect", f"{hint}{where}")
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


# --------------------------------------------------------------------------------------------------
# 1. The token and position embedding


class Embedding(nn.Module):
    """Token plus position embedding: X[b, n] = E[idx[b, n]] + R[start + n]."""

    def __init__(self, config):
        super().__init__()
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)  # E: (V, D)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)  # R: (C, D)

    def forward(self, idx, start=0):
        N = idx.shape[1]
        positions = torch.arange(start, start + N, device=idx.device)  # start, ..., start + N - 1
        return self.tok_emb(idx) + self.pos_emb(positions)  # (B, N, D) + (N, D) -> (B, N, D)


class _Embedding(Embedding):
    """Wrong embeddings: one attribute per mistake."""

    offset, positions, honours_start, scaled, concatenated = 0, True, True, False, False

    def forward(self, idx, start=0):
        N, D = idx.shape[1], self.tok_emb.embedding_dim
        first = (start if self.honours_start else 0) + self.offset
        R = self.pos_emb(torch.arange(first, first + N, device=idx.device))  # (N, D)
        X = self.tok_emb(idx) * (math.sqrt(D) if self.scaled else 1.0)  # (B, N, D)
        if self.concatenated:
            return torch.cat([X, R.expand_as(X)], dim=-1)  # (B, N, 2D)
        return X + R if self.positions else X


def _variant(base: type, name: str, **attrs: Any) -> type:
    """A subclass of ``base`` with some class attributes changed: one typical mistake."""
    return type(name, (base,), attrs)


WHY_POSITIONS_OFF_BY_ONE = (
    "your positions are off by one: the first token sits at position 0, so the positions are "
    "torch.arange(start, start + N), not start + 1, ..., start + N."
)
WHY_NO_POSITIONS = (
    "you left out the position embedding: add R[start + n] (self.pos_emb of the positions) to each "
    "token vector, or the model cannot tell in which order the tokens came."
)
WHY_IGNORES_START = (
    "your positions ignore `start`: with a KV cache the N new tokens sit at positions start, ..., "
    "start + N - 1, so add R[start + n], not R[n] (GPT.forward passes start = len(caches[0]))."
)
WHY_EMBEDDING_SCALED = (
    "you multiplied the token vectors by sqrt(D), as the original transformer does with its shared "
    "embeddings; GPT adds them as they are: X = E[idx] + R[positions]."
)
WHY_EMBEDDING_CONCATENATED = (
    "you concatenated the token and position vectors (width 2D); they are added, so X stays "
    "(B, N, D)."
)
_OffByOne = _variant(_Embedding, "_OffByOne", offset=1)
_NoPositions = _variant(_Embedding, "_NoPositions", positions=False)
_IgnoresStart = _variant(_Embedding, "_IgnoresStart", honours_start=False)
_ScaledTokens = _variant(_Embedding, "_ScaledTokens", scaled=True)
_Concatenated = _variant(_Embedding, "_Concatenated", concatenated=True)
EMBEDDING_MISTAKES = [
    Mistake(WHY_POSITIONS_OFF_BY_ONE, _OffByOne),
    Mistake(WHY_NO_POSITIONS, _NoPositions),
    Mistake(WHY_IGNORES_START, _IgnoresStart),
    Mistake(WHY_EMBEDDING_SCALED, _ScaledTokens),
    Mistake(WHY_EMBEDDING_CONCATENATED, _Concatenated),
]


def _embedding_cases() -> list:
    cases = []
    for k, config in enumerate(_CONFIGS):
        g = torch.Generator().manual_seed(10 + k)
        C = config.block_size
        idx = torch.randint(config.vocab_size, (2, C - 1), generator=g)
        more = torch.randint(config.vocab_size, (2, 3), generator=g)
        cases.append((config, idx, more, C - 4))  # `more` at positions C-4, C-3, C-2
    return cases


def _observe_embedding(answer: Any, case: tuple) -> Output:
    config, idx, more, start = case
    state = _part(lab_state_dict(package_gpt(config)), "embed.")
    embed = _build(answer, config, state, "Embedding")
    with torch.no_grad():
        return {
            "embed(idx)": _tensor(embed(idx), "Embedding.forward"),
            f"embed(idx, start={start})": _tensor(embed(more, start), "Embedding.forward"),
        }


def _expected_embedding(case: tuple) -> Output:
    config, idx, more, start = case
    model = package_gpt(config)
    with torch.no_grad():
        return {
            "embed(idx)": model.pos_emb(model.tok_emb(idx)),
            f"embed(idx, start={start})": model.pos_emb(model.tok_emb(more), start=start),
        }


def _describe_tokens(case: tuple) -> str:
    return f"case: {_sizes_of(case[0])}; idx {tuple(case[1].shape)}"


_register(
    CapstoneExercise(
        name="language_models.embedding",
        prompt=(
            "Write the class Embedding(config): the token table tok_emb = nn.Embedding(V, D) and the "
            "learned positions pos_emb = nn.Embedding(C, D); forward(idx (B, N), start=0) returns "
            "E[idx] + R[start : start + N], shape (B, N, D)."
        ),
        solution=Embedding,
        mistakes=EMBEDDING_MISTAKES,
        cases=_embedding_cases,
        observe=_observe_embedding,
        expected=_expected_embedding,
        describe=_describe_tokens,
        atol=1e-6,
        rtol=1e-6,
        passed="matches the package's embedding",
    )
)


# --------------------------------------------------------------------------------------------------
# 2. Causal multi-head self-attention


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention: softmax(Q K^T / sqrt(d_k) + mask) V per head, then W_o."""

    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.H, self.d_k = config.H, D // config.H
        self.in_proj = nn.Linear(D, 3 * D)  # W_q, W_k, W_v side by side (stored transposed)
        self.out_proj = nn.Linear(D, D)  # W_o

    def forward(self, X, cache=None):
        B, N, D = X.shape
        Q, K, V = self.in_proj(X).split(D, dim=-1)  # (B, N, D) each
        Q, K, V = (T.view(B, N, self.H, self.d_k) for T in (Q, K, V))  # (B, N, H, d_k) each
        Q, K, V = Q.transpose(1, 2), K.transpose(1, 2), V.transpose(1, 2)  # (B, H, N, d_k) each
        if cache is not None:  # part 9: the earlier tokens' keys and values come first
            K, V = cache.update(K, V)  # (B, H, M, d_k), M = tokens so far
        M = K.shape[2]
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, N, M) scores
        # query n is the token at position M - N + n: it may not see the keys after it
        future = torch.ones(N, M, dtype=torch.bool, device=X.device).triu(M - N + 1)  # (N, M)
        A = torch.softmax(S.masked_fill(future, float("-inf")), dim=-1)  # each row sums to one
        Y = (A @ V).transpose(1, 2).reshape(B, N, D)  # (B, N, H, d_k): the heads side by side
        return self.out_proj(Y)  # (B, N, D)


class _Attention(CausalSelfAttention):
    """Wrong attention layers: one attribute per mistake."""

    mask = "causal"  # "none", "past" (hides the past), "top_left" (not offset), "not_with_cache"
    scale = "d_k"  # "none", "D"
    softmax_dim = -1
    split_transposed = merge_transposed = projects_out = uses_cache = True
    masks_after_softmax = False

    def forward(self, X, cache=None):
        B, N, D = X.shape
        Q, K, V = self.in_proj(X).split(D, dim=-1)
        if self.split_transposed:
            Q, K, V = (T.view(B, N, self.H, self.d_k).transpose(1, 2) for T in (Q, K, V))
        else:
            Q, K, V = (T.reshape(B, self.H, N, self.d_k) for T in (Q, K, V))
        if cache is not None and self.uses_cache:
            K, V = cache.update(K, V)
        M = K.shape[2]
        scale = {"d_k": math.sqrt(self.d_k), "D": math.sqrt(D), "none": 1.0}[self.scale]
        S = Q @ K.transpose(-2, -1) / scale
        ones = torch.ones(N, M, dtype=torch.bool, device=X.device)
        mask = self.mask if not (self.mask == "not_with_cache" and cache is None) else "causal"
        hidden = {
            "causal": ones.triu(M - N + 1),
            "top_left": ones.triu(1),
            "past": ones.tril(M - N - 1),
            "none": ~ones,
            "not_with_cache": ~ones,
        }[mask]
        if self.masks_after_softmax:
            A = torch.softmax(S, dim=self.softmax_dim) * ~hidden
        else:
            A = torch.softmax(S.masked_fill(hidden, float("-inf")), dim=self.softmax_dim)
        Y = A @ V  # (B, H, N, d_k)
        Y = Y.transpose(1, 2).reshape(B, N, D) if self.merge_transposed else Y.reshape(B, N, D)
        return self.out_proj(Y) if self.projects_out else Y


WHY_NO_MASK = (
    "your attention has no causal mask: every token sees the tokens after it, which do not exist yet "
    "when the model generates. Set the scores of keys m > n to -inf before the softmax."
)
WHY_MASK_HIDES_PAST = (
    "your mask hides the past and shows the future: query n may see the keys m <= n (the lower "
    "triangle), so mask the scores where torch.ones(N, N).triu(1) is True."
)
WHY_NO_SCALE = (
    "the scores are not scaled: divide Q K^T by sqrt(d_k) before the softmax, with d_k = D / H the "
    "width of one head."
)
WHY_SCALE_D = (
    "you scaled the scores by 1/sqrt(D); the scale is 1/sqrt(d_k), with d_k = D / H the width of one "
    "head."
)
WHY_SOFTMAX_AXIS = (
    "the softmax ran over the queries (dim=-2); each query's weights over the keys must sum to one: "
    "softmax over dim=-1."
)
WHY_SPLIT_HEADS = (
    "the heads are split wrongly: view (B, N, D) as (B, N, H, d_k), then transpose to (B, H, N, d_k); "
    "reshaping straight to (B, H, N, d_k) mixes features of different tokens into one row."
)
WHY_MERGE_HEADS = (
    "the heads are merged wrongly: transpose (B, H, N, d_k) back to (B, N, H, d_k) before reshaping "
    "to (B, N, D), so that each token gets its own heads' outputs."
)
WHY_NO_OUT_PROJ = (
    "you left out the output projection: the concatenated heads go through W_o, self.out_proj."
)
WHY_MASK_AFTER_SOFTMAX = (
    "you zeroed the future's weights after the softmax, so the rows no longer sum to one; set the "
    "future's scores to -inf before the softmax."
)
ATTENTION_MISTAKES = [
    Mistake(WHY_NO_MASK, _variant(_Attention, "_NoMask", mask="none")),
    Mistake(WHY_MASK_HIDES_PAST, _variant(_Attention, "_HidesPast", mask="past")),
    Mistake(WHY_NO_SCALE, _variant(_Attention, "_NoScale", scale="none")),
    Mistake(WHY_SCALE_D, _variant(_Attention, "_ScaleD", scale="D")),
    Mistake(WHY_SOFTMAX_AXIS, _variant(_Attention, "_QueryAxis", softmax_dim=-2)),
    Mistake(WHY_SPLIT_HEADS, _variant(_Attention, "_BadSplit", split_transposed=False)),
    Mistake(WHY_MERGE_HEADS, _variant(_Attention, "_BadMerge", merge_transposed=False)),
    Mistake(WHY_NO_OUT_PROJ, _variant(_Attention, "_NoOutProj", projects_out=False)),
    Mistake(WHY_MASK_AFTER_SOFTMAX, _variant(_Attention, "_MaskAfter", masks_after_softmax=True)),
]


def _token_vectors_cases() -> list:
    cases = []
    for k, config in enumerate(_CONFIGS):
        g = torch.Generator().manual_seed(20 + k)
        cases.append((config, randn(g, 2, config.block_size - 1, config.d_model)))
    return cases


def _observe_attention(answer: Any, case: tuple) -> Output:
    config, X = case
    state = _part(lab_state_dict(package_gpt(config)), "blocks.0.attn.")
    attn = _build(answer, config, state, "CausalSelfAttention")
    with torch.no_grad():
        return {"attn(X)": _tensor(attn(X), "CausalSelfAttention.forward")}


def _expected_attention(case: tuple) -> Output:
    config, X = case
    with torch.no_grad():
        return {"attn(X)": package_gpt(config).stack.blocks[0].attn(X)}


def _describe_vectors(case: tuple) -> str:
    return f"case: {_sizes_of(case[0])}; X {tuple(case[1].shape)}"


_register(
    CapstoneExercise(
        name="language_models.attention",
        prompt=(
            "Write the class CausalSelfAttention(config): in_proj = nn.Linear(D, 3D) computes Q, K, V "
            "at once and out_proj = nn.Linear(D, D) is W_o; forward(X (B, N, D), cache=None) splits "
            "H heads of width d_k = D / H, takes softmax(Q K^T / sqrt(d_k)) over the keys with the "
            "future masked, and returns W_o applied to the concatenated heads, (B, N, D)."
        ),
        solution=CausalSelfAttention,
        mistakes=ATTENTION_MISTAKES,
        cases=_token_vectors_cases,
        observe=_observe_attention,
        expected=_expected_attention,
        describe=_describe_vectors,
        atol=1e-6,
        rtol=1e-6,
        passed="matches the package's attention",
    )
)


# --------------------------------------------------------------------------------------------------
# 3. The pre-norm block


class Block(nn.Module):
    """Pre-norm transformer block: Z = X + attn(LN1(X)), then Y = Z + MLP(LN2(Z))."""

    def __init__(self, config):
        super().__init__()
        D = config.d_model
        self.norm1 = nn.LayerNorm(D)
        self.attn = CausalSelfAttention(config)
        self.norm2 = nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, X, cache=None):
        Z = X + self.attn(self.norm1(X), cache)  # (B, N, D): attention, with a residual connection
        return Z + self.mlp(self.norm2(Z))  # (B, N, D): the token-wise MLP, with a residual


class _Block(Block):
    """Wrong blocks: one attribute per mistake (``attention`` swaps in a wrong attention layer)."""

    arrangement = "pre"  # or post, no_attn_residual, no_mlp_residual, one_norm, normed_residual
    relu = False
    attention: type | None = None

    def __init__(self, config):
        super().__init__(config)
        if self.attention is not None:
            self.attn.__class__ = self.attention  # a subclass with another forward: same parameters

    def forward(self, X, cache=None):
        def mlp(h):
            return self.mlp[2](F.relu(self.mlp[0](h))) if self.relu else self.mlp(h)

        a = self.arrangement
        if a == "post":
            Z = self.norm1(X + self.attn(X, cache))
            return self.norm2(Z + mlp(Z))
        h = self.norm1(X)
        Z = {"no_attn_residual": 0, "normed_residual": h}.get(a, X) + self.attn(h, cache)
        g = (self.norm1 if a == "one_norm" else self.norm2)(Z)
        return (0 if a == "no_mlp_residual" else (g if a == "normed_residual" else Z)) + mlp(g)


WHY_POST_NORM = (
    "your block is post-norm, LN(X + attn(X)), the original transformer's arrangement; GPT's block is "
    "pre-norm: Z = X + attn(LN1(X)), then Y = Z + MLP(LN2(Z))."
)
WHY_NO_ATTN_RESIDUAL = (
    "the attention has no residual connection: add its output to the block's input, "
    "Z = X + attn(LN1(X))."
)
WHY_NO_MLP_RESIDUAL = "the MLP has no residual connection: Y = Z + MLP(LN2(Z))."
WHY_NORMED_RESIDUAL = (
    "your residual connections carry the normalised input: Z = X + attn(LN1(X)) adds to X itself, "
    "not to LN1(X) (in a pre-norm block the residual stream is never normalised)."
)
WHY_ONE_NORM = (
    "you used norm1 before the MLP too; each sub-layer has its own LayerNorm: norm2 before the MLP."
)
WHY_RELU = (
    "your MLP uses ReLU; the package's GPT uses GELU (nn.GELU(), the exact form), as GPT-2 does."
)
BLOCK_ONLY_MISTAKES = [
    Mistake(WHY_POST_NORM, _variant(_Block, "_PostNorm", arrangement="post")),
    Mistake(WHY_NO_ATTN_RESIDUAL, _variant(_Block, "_NoAttnRes", arrangement="no_attn_residual")),
    Mistake(WHY_NO_MLP_RESIDUAL, _variant(_Block, "_NoMlpRes", arrangement="no_mlp_residual")),
    Mistake(WHY_NORMED_RESIDUAL, _variant(_Block, "_NormedRes", arrangement="normed_residual")),
    Mistake(WHY_ONE_NORM, _variant(_Block, "_OneNorm", arrangement="one_norm")),
    Mistake(WHY_RELU, _variant(_Block, "_Relu", relu=True)),
]
BLOCK_MISTAKES = BLOCK_ONLY_MISTAKES + [
    Mistake(m.why, _variant(_Block, "_BlockWith" + m.wrong.__name__, attention=m.wrong))
    for m in ATTENTION_MISTAKES
]


def _observe_block(answer: Any, case: tuple) -> Output:
    config, X = case
    state = _part(lab_state_dict(package_gpt(config)), "blocks.0.")
    block = _build(answer, config, state, "Block")
    with torch.no_grad():
        return {"block(X)": _tensor(block(X), "Block.forward")}


def _expected_block(case: tuple) -> Output:
    config, X = case
    with torch.no_grad():
        return {"block(X)": package_gpt(config).stack.blocks[0](X)}


def _diagnose(got: Tensor, mistakes: list[Mistake], run: Callable[[type], Tensor]) -> str | None:
    """The ``why`` of the first mistake whose part, run on the same input, gives ``got``."""
    for mistake in mistakes:
        try:
            wrong = _outcome(run, mistake.wrong)
        except _Verdict:
            continue
        if isinstance(wrong, Tensor) and wrong.shape == got.shape and torch.allclose(wrong, got):
            return mistake.why
    return None


def _locate_block(block: nn.Module, theirs: nn.Module, X: Tensor, config: GPTConfig, prefix: str):
    """Where the learner's block ``block`` departs from the package's ``theirs`` on the input ``X``."""
    state = _part(lab_state_dict(package_gpt(config)), prefix)
    h = theirs.norm1(X)
    mine = _tensor(block.attn(h), "attn")
    if mine.shape != h.shape or not torch.allclose(mine, theirs.attn(h), atol=1e-6, rtol=1e-6):
        why = _diagnose(
            mine,
            ATTENTION_MISTAKES,
            lambda cls: _build(cls, config, _part(state, "attn."), "attention")(h),
        )
        return why or (
            "the block's attention differs from the package's (its output for LN1(X)); check it "
            "with language_models.attention."
        )
    mine = _tensor(block(X), "Block.forward")
    why = _diagnose(mine, BLOCK_ONLY_MISTAKES, lambda cls: _build(cls, config, state, "block")(X))
    return why or (
        "the block differs from the package's although its attention matches: look at the two "
        "LayerNorms, the residual connections and the MLP (Linear(D, 4D), GELU, Linear(4D, D))."
    )


def _locate_block_answer(answer: Any, case: tuple) -> str | None:
    config, X = case
    block = _build(answer, config, _part(lab_state_dict(package_gpt(config)), "blocks.0."), "Block")
    with torch.no_grad():
        return _locate_block(block, package_gpt(config).stack.blocks[0], X, config, "blocks.0.")


_register(
    CapstoneExercise(
        name="language_models.block",
        prompt=(
            "Write the class Block(config), a pre-norm transformer block: norm1 and norm2 are "
            "nn.LayerNorm(D), attn a CausalSelfAttention and mlp = nn.Sequential(nn.Linear(D, 4D), "
            "nn.GELU(), nn.Linear(4D, D)); forward(X, cache=None) returns Z + MLP(LN2(Z)) with "
            "Z = X + attn(LN1(X))."
        ),
        solution=Block,
        mistakes=BLOCK_MISTAKES,
        cases=_token_vectors_cases,
        observe=_observe_block,
        expected=_expected_block,
        locate=_locate_block_answer,
        describe=_describe_vectors,
        atol=1e-6,
        rtol=1e-6,
        passed="matches the package's pre-norm block",
    )
)


# --------------------------------------------------------------------------------------------------
# 4. The model


class GPT(nn.Module):
    """A decoder-only transformer language model: embedding, L blocks, final LayerNorm, tied head."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed = Embedding(config)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.final_norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # W_vocab: (V, D)
        self.lm_head.weight = self.embed.tok_emb.weight  # tied: W_vocab = E^T (Press & Wolf 2017)

    def forward(self, idx, targets=None, caches=None):
        start = len(caches[0]) if caches else 0  # part 9: positions continue after the cached ones
        X = self.embed(idx, start)  # (B, N, D)
        for ell, block in enumerate(self.blocks):
            X = block(X, None if caches is None else caches[ell])  # (B, N, D)
        logits = self.lm_head(self.final_norm(X))  # (B, N, V)
        if targets is None:
            return logits, None
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # mean over B * N tokens
        return logits, loss


class _GPT(GPT):
    """Wrong models: one attribute per mistake, or a wrong part swapped in (same parameters)."""

    final_norm_used, one_cache, loss_kind = True, False, "mean"  # loss_kind: "sum", "softmax"
    embedding: type | None = None
    block: type | None = None
    attention: type | None = None

    def __init__(self, config):
        super().__init__(config)
        if self.embedding is not None:
            self.embed.__class__ = self.embedding
        for block in self.blocks:
            if self.block is not None:
                block.__class__ = self.block
            if self.attention is not None:
                block.attn.__class__ = self.attention

    def forward(self, idx, targets=None, caches=None):
        X = self.embed(idx, len(caches[0]) if caches else 0)
        for ell, block in enumerate(self.blocks):
            X = block(X, None if caches is None else caches[0 if self.one_cache else ell])
        logits = self.lm_head(self.final_norm(X) if self.final_norm_used else X)
        if targets is None:
            return logits, None
        flat, t = logits.flatten(0, 1), targets.flatten()
        if self.loss_kind == "sum":
            return logits, F.cross_entropy(flat, t, reduction="sum")
        if self.loss_kind == "softmax":
            return logits, F.cross_entropy(torch.softmax(flat, dim=-1), t)
        return logits, F.cross_entropy(flat, t)


class _Untied(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # not tied


class _TransposedHead(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.vocab_size, config.d_model, bias=False)  # weight (D, V)

    def forward(self, idx, targets=None, caches=None):
        X = self.embed(idx)
        for block in self.blocks:
            X = block(X)
        return self.final_norm(X) @ self.lm_head.weight, None


WHY_NO_FINAL_NORM = (
    "your model has no final LayerNorm before the head: in a pre-norm stack the residual stream is "
    "never normalised otherwise, so logits = lm_head(final_norm(X))."
)
WHY_UNTIED = (
    "your head is not tied to the token table: the package's GPT uses W_vocab = E^T (Press & Wolf "
    "2017), so set self.lm_head.weight = self.embed.tok_emb.weight (untied, the model has V x D more "
    "parameters and trains differently)."
)
WHY_TRANSPOSED = (
    "it is transposed: nn.Linear(in_features, out_features) stores its weight as (out_features, "
    "in_features) and computes X @ weight.T (the head is nn.Linear(D, V, bias=False))."
)
WHY_LOSS_SUMMED = (
    "your loss is the sum over the B * N predictions; it is their mean (F.cross_entropy's default), "
    "so that the learning rate does not depend on the batch size or the context length."
)
WHY_SOFTMAX_BEFORE_LOSS = (
    "you applied a softmax before F.cross_entropy, which takes logits and applies the log-softmax "
    "itself: pass it the logits."
)
GPT_ONLY_MISTAKES = [
    Mistake(WHY_NO_FINAL_NORM, _variant(_GPT, "_NoFinalNorm", final_norm_used=False)),
    Mistake(WHY_UNTIED, _Untied),
    Mistake(WHY_TRANSPOSED, _TransposedHead),
    Mistake(WHY_LOSS_SUMMED, _variant(_GPT, "_SummedLoss", loss_kind="sum")),
    Mistake(WHY_SOFTMAX_BEFORE_LOSS, _variant(_GPT, "_SoftmaxLoss", loss_kind="softmax")),
]
GPT_MISTAKES = (
    GPT_ONLY_MISTAKES
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, embedding=m.wrong))
        for m in EMBEDDING_MISTAKES
        if m.wrong not in (_IgnoresStart, _Concatenated)  # no cache here; 2D breaks the blocks
    ]
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, block=m.wrong))
        for m in BLOCK_ONLY_MISTAKES
    ]
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, attention=m.wrong))
        for m in ATTENTION_MISTAKES
    ]
)


def _gpt_cases() -> list:
    cases = []
    for k, config in enumerate(_CONFIGS):
        g = torch.Generator().manual_seed(30 + k)
        idx, targets = torch.randint(config.vocab_size, (2, 2, config.block_size - 1), generator=g)
        cases.append((config, idx, targets))
    return cases


def _logits_and_loss(out: Any) -> tuple[Tensor, Any]:
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise _Verdict(
            f"GPT.forward must return the pair (logits, loss), got a {type(out).__name__}; return "
            "(logits, None) when no targets are given."
        )
    return _tensor(out[0], "GPT.forward"), out[1]


def _observe_gpt(answer: Any, case: tuple) -> Output:
    config, idx, targets = case
    model = _build(answer, config, lab_state_dict(package_gpt(config)), "GPT")
    if config.tie_weights and model.lm_head.weight is not model.embed.tok_emb.weight:
        raise _Verdict(WHY_UNTIED)
    if getattr(model, "config", None) != config:
        raise _Verdict("keep the configuration as self.config (generation reads model.config).")
    with torch.no_grad():
        logits, loss = _logits_and_loss(model(idx, targets))
    if loss is None:
        raise _Verdict("given targets, GPT.forward must also return the loss, (logits, loss).")
    return {"logits": logits, "loss": _tensor(loss, "GPT.forward").reshape(())}


def _expected_gpt(case: tuple) -> Output:
    config, idx, targets = case
    with torch.no_grad():
        logits = package_gpt(config)(idx)[0]
    return {"logits": logits, "loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten())}


def _locate_gpt(answer: Any, case: tuple) -> str | None:
    """Which part of the learner's GPT departs from the package's: the first that differs."""
    config, idx, targets = case
    theirs, state = package_gpt(config), lab_state_dict(package_gpt(config))
    model = _build(answer, config, state, "GPT")
    with torch.no_grad():
        X = theirs.pos_emb(theirs.tok_emb(idx))
        mine = _tensor(model.embed(idx), "Embedding.forward")
        if mine.shape != X.shape or not torch.allclose(mine, X, atol=1e-6, rtol=1e-6):
            part = _part(state, "embed.")
            why = _diagnose(
                mine, EMBEDDING_MISTAKES, lambda cls: _build(cls, config, part, "embedding")(idx)
            )
            return (
                why
                or "your embedding (self.embed) differs: check it with language_models.embedding."
            )
        for ell, (block, their_block) in enumerate(
            zip(model.blocks, theirs.stack.blocks, strict=True)
        ):
            Y = their_block(X)
            mine = _tensor(block(X), "Block.forward")
            if mine.shape != Y.shape or not torch.allclose(mine, Y, atol=1e-6, rtol=1e-6):
                return f"block {ell}: " + _locate_block(
                    block, their_block, X, config, f"blocks.{ell}."
                )
            X = Y
        mine = _tensor(model.final_norm(X), "final_norm")
        if not torch.allclose(mine, theirs.stack.final_norm(X), atol=1e-6, rtol=1e-6):
            return "your final_norm differs from the package's: it is nn.LayerNorm(D)."
        logits = theirs(idx)[0]
        got = _logits_and_loss(model(idx, targets))[0]
    if got.shape == logits.shape and torch.allclose(got, logits, atol=1e-6, rtol=1e-6):
        return (
            "the logits match but the loss does not: it is the mean cross-entropy over all B * N "
            "positions, F.cross_entropy(logits.flatten(0, 1), targets.flatten())."
        )
    return (
        "each part matches the package's on its own, but the logits do not: look at how forward "
        "connects them (the blocks in order, final_norm, then lm_head)."
    )


_register(
    CapstoneExercise(
        name="language_models.gpt",
        prompt=(
            "Write the class GPT(config): embed = Embedding(config), blocks = an nn.ModuleList of "
            "config.n_layers Blocks, final_norm = nn.LayerNorm(D), and lm_head = nn.Linear(D, V, "
            "bias=False) tied to the token table; forward(idx, targets=None, caches=None) returns "
            "(logits (B, N, V), loss), the loss being the mean cross-entropy of the targets."
        ),
        solution=GPT,
        mistakes=GPT_MISTAKES,
        cases=_gpt_cases,
        observe=_observe_gpt,
        expected=_expected_gpt,
        locate=_locate_gpt,
        describe=_describe_tokens,
        atol=1e-6,
        rtol=1e-6,
        passed="logits and loss match the package's GPT with the same weights",
    )
)


# --------------------------------------------------------------------------------------------------
# 5. Batches of windows


def get_batch(ids, block_size, batch_size, generator=None):
    """`batch_size` random windows x of `block_size` tokens from `ids`, and the next tokens y."""
    starts = torch.randint(len(ids) - block_size, (batch_size,), generator=generator)  # (B,)
    x = torch.stack([ids[s : s + block_size] for s in starts])  # (B, C)
    y = torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])  # (B, C): shifted by one
    return x, y


def _not_shifted(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, x.clone()


def _shifted_back(ids, block_size, batch_size, generator=None):
    starts = 1 + torch.randint(len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s - 1 : s - 1 + block_size] for s in starts])


def _added_one(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, x + 1


def _two_draws(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, get_batch(ids, block_size, batch_size, generator)[1]


def _global_rng(ids, block_size, batch_size, generator=None):
    return get_batch(ids, block_size, batch_size, None)


def _one_start(ids, block_size, batch_size, generator=None):
    s = int(torch.randint(len(ids) - block_size, (1,), generator=generator))
    x, y = ids[s : s + block_size], ids[s + 1 : s + block_size + 1]
    return x.expand(batch_size, -1).clone(), y.expand(batch_size, -1).clone()


def _columns(ids, block_size, batch_size, generator=None):
    x, y = get_batch(ids, block_size, batch_size, generator)
    return x.T.contiguous(), y.T.contiguous()


def _never_last(ids, block_size, batch_size, generator=None):
    starts = torch.randint(len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])


def _past_end(ids, block_size, batch_size, generator=None):
    starts = torch.randint(len(ids) - block_size + 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])


WHY_BATCH_NOT_SHIFTED = (
    "your targets are not shifted: y is the window one position later, y[b, n] = ids[s + n + 1] (the "
    "next token), not x itself."
)
WHY_BATCH_SHIFTED_BACK = (
    "your targets are shifted the wrong way: y[b, n] is the token after x[b, n] (ids[s + n + 1]), not "
    "the one before it."
)
WHY_BATCH_ADDED_ONE = (
    "you added one to the token ids (y = x + 1); the targets are the next tokens of the text, "
    "y = ids[s + 1 : s + block_size + 1]."
)
WHY_BATCH_TWO_DRAWS = (
    "x and y come from different windows: draw the starts once, then take x = ids[s : s + block_size] "
    "and y = ids[s + 1 : s + block_size + 1] from the same start s."
)
WHY_BATCH_IGNORES_GENERATOR = (
    "your batches ignore the generator: the same seed must give the same batch (pass "
    "generator=generator to torch.randint)."
)
WHY_BATCH_ONE_START = (
    "every row of your batch is the same window: draw batch_size starts, one per row, "
    "torch.randint(..., (batch_size,))."
)
WHY_BATCH_TRANSPOSED = (
    "your x and y are (block_size, batch_size); they are (batch_size, block_size), one window "
    "per row."
)
WHY_BATCH_NEVER_LAST = (
    "the last window is never drawn: the starts run from 0 to len(ids) - block_size - 1 inclusive, "
    "torch.randint(len(ids) - block_size, ...) (randint's upper bound is excluded)."
)
WHY_BATCH_PAST_END = (
    "a window ran past the end of ids: y needs one token after x, so the last start is "
    "len(ids) - block_size - 1; draw the starts with torch.randint(len(ids) - block_size, ...)."
)
WHY_BATCH_NOT_WINDOWS = (
    "the rows of x are not windows of ids: row b is ids[s_b : s_b + block_size], consecutive "
    "tokens."
)
BATCH_MISTAKES = [
    Mistake(WHY_BATCH_NOT_SHIFTED, _not_shifted),
    Mistake(WHY_BATCH_SHIFTED_BACK, _shifted_back),
    Mistake(WHY_BATCH_ADDED_ONE, _added_one),
    Mistake(WHY_BATCH_TWO_DRAWS, _two_draws),
    Mistake(WHY_BATCH_IGNORES_GENERATOR, _global_rng),
    Mistake(WHY_BATCH_ONE_START, _one_start),
    Mistake(WHY_BATCH_TRANSPOSED, _columns),
    Mistake(WHY_BATCH_NEVER_LAST, _never_last),
    Mistake(WHY_BATCH_PAST_END, _past_end),
]


def _pair(out: Any) -> tuple[Tensor, Tensor]:
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise _Verdict(f"get_batch must return the pair (x, y), got a {type(out).__name__}.")
    return _tensor(out[0], "get_batch"), _tensor(out[1], "get_batch")


def _observe_batch(answer: Any, case: tuple) -> Output:
    """Properties of the answer's batches; ``{}`` when all hold (any correct draw passes)."""
    n, C, B = case
    # distinct token ids, so that each token says where in ids it was taken from
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    where = torch.empty(n, dtype=torch.long)
    where[ids] = torch.arange(n)  # where[token] = its position in ids
    x, y = _pair(answer(ids, C, B, torch.Generator().manual_seed(1)))
    if x.shape != (B, C) or y.shape != (B, C):
        if x.shape == (C, B):
            raise _Verdict(WHY_BATCH_TRANSPOSED)
        raise _Verdict(
            f"x and y must both be (batch_size, block_size) = {(B, C)}, got {tuple(x.shape)} and "
            f"{tuple(y.shape)}."
        )
    if x.is_floating_point() or y.is_floating_point():
        raise _Verdict("x and y hold token ids, integers (torch.long), not floats.")
    if torch.equal(y, x + 1):
        raise _Verdict(WHY_BATCH_ADDED_ONE)
    if torch.equal(y, x):
        raise _Verdict(WHY_BATCH_NOT_SHIFTED)
    if not (0 <= min(x.min(), y.min()) and max(x.max(), y.max()) < n):
        raise _Verdict("x and y must hold tokens of ids (take the windows from ids itself).")
    px, py = where[x], where[y]
    if not (px[:, 1:] - px[:, :-1] == 1).all():
        raise _Verdict(WHY_BATCH_NOT_WINDOWS)
    if torch.equal(py, px - 1):
        raise _Verdict(WHY_BATCH_SHIFTED_BACK)
    if not torch.equal(py, px + 1):
        raise _Verdict(WHY_BATCH_TWO_DRAWS)
    again = _pair(answer(ids, C, B, torch.Generator().manual_seed(1)))
    if not (torch.equal(again[0], x) and torch.equal(again[1], y)):
        raise _Verdict(WHY_BATCH_IGNORES_GENERATOR)
    if (px[:, 0] == px[0, 0]).all():
        raise _Verdict(WHY_BATCH_ONE_START)
    short = torch.randperm(C + 3, generator=torch.Generator().manual_seed(2))  # 3 windows fit
    try:
        sx, _ = _pair(answer(short, C, 300, torch.Generator().manual_seed(3)))
    except (IndexError, RuntimeError):
        raise _Verdict(WHY_BATCH_PAST_END) from None
    first = {int((short == t).nonzero()) for t in sx[:, 0]}  # the starts drawn
    if not first <= {0, 1, 2}:
        raise _Verdict(WHY_BATCH_PAST_END)
    if 2 not in first:
        raise _Verdict(WHY_BATCH_NEVER_LAST)
    if first != {0, 1, 2}:
        raise _Verdict(
            f"your windows never start at {sorted({0, 1, 2} - first)}: every start from 0 to "
            "len(ids) - block_size - 1 must be possible."
        )
    return {}


_register(
    CapstoneExercise(
        name="language_models.get_batch",
        prompt=(
            "Write get_batch(ids, block_size, batch_size, generator=None): batch_size windows x of "
            "block_size consecutive tokens of the 1-D tensor ids, each starting at a random position "
            "drawn with the generator, and the same windows shifted by one, y; returns (x, y), each "
            "(batch_size, block_size)."
        ),
        solution=get_batch,
        mistakes=BATCH_MISTAKES,
        cases=lambda: [(1000, 8, 16)],
        observe=_observe_batch,
        describe=lambda case: (
            f"case: len(ids) = {case[0]}, block_size = {case[1]}, batch_size = {case[2]}"
        ),
        kind="function",
        passed="every property holds (shapes, shift by one, windows inside ids, every start drawn, "
        "the generator's seed decides)",
    )
)


# --------------------------------------------------------------------------------------------------
# 6. The training loop


def train_loop(model, next_batch, recipe, steps, seed=0):
    """Train `model` in place for `steps` steps with `recipe`'s settings; return the step losses."""
    cfg = recipe.with_steps(steps).train  # lr, warmup_steps, weight_decay, betas, grad_clip, ...
    gen = torch.Generator().manual_seed(seed)  # draws the batches
    matrices = [p for p in model.parameters() if p.dim() >= 2]  # weight decay on matrices only
    others = [p for p in model.parameters() if p.dim() < 2]  # biases, LayerNorm gains
    optimizer = torch.optim.AdamW(
        [
            {"params": matrices, "weight_decay": cfg.weight_decay},
            {"params": others, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=cfg.betas,
    )
    losses = []
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, cfg)  # warm-up, then cosine decay
        x, y = next_batch(gen)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        losses.append(loss.item())
    return losses


def _wrong_loop(
    zero_grad: bool = True,
    clip: bool = True,
    schedule: bool = True,
    decay_all: bool = False,
    default_betas: bool = False,
    fresh_generator: bool = False,
    step: bool = True,
) -> Callable:
    """A training loop with one typical mistake (the reference when every flag keeps its default)."""

    def loop(model, next_batch, recipe, steps, seed=0):
        cfg = recipe.with_steps(steps).train
        gen = torch.Generator().manual_seed(seed)
        params = list(model.parameters())
        groups = [
            {
                "params": [p for p in params if decay_all or p.dim() >= 2],
                "weight_decay": cfg.weight_decay,
            },
            {"params": [p for p in params if not decay_all and p.dim() < 2], "weight_decay": 0.0},
        ]
        betas = (0.9, 0.999) if default_betas else cfg.betas
        optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=betas)
        losses = []
        for s in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(s, cfg) if schedule else cfg.lr
            batch = next_batch(torch.Generator().manual_seed(seed) if fresh_generator else gen)
            _, loss = model(*batch)
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if step:
                optimizer.step()
            losses.append(loss.item())
        return losses

    return loop


WHY_NO_ZERO_GRAD = (
    "the gradients accumulate from step to step: call optimizer.zero_grad() before loss.backward() at "
    "every step."
)
WHY_NO_CLIP = (
    "the gradients are not clipped: after loss.backward() and before optimizer.step(), clip their "
    "global norm to cfg.grad_clip with torch.nn.utils.clip_grad_norm_."
)
WHY_CONSTANT_LR = (
    "the learning rate never changes: set each step's rate, lr_at(step, cfg) (warm-up, then cosine "
    "decay), in every parameter group before optimizer.step()."
)
WHY_DECAY_ALL = (
    "weight decay acts on every parameter; the recipe decays the matrices only (parameters with "
    "dim >= 2), not the biases and LayerNorm gains (two parameter groups)."
)
WHY_DEFAULT_BETAS = "your AdamW uses its default betas; use the recipe's, betas=cfg.betas."
WHY_SAME_BATCH = (
    "every step trains on the same batch: create the generator once, before the loop, and pass that "
    "one generator to next_batch at every step."
)
WHY_NO_STEP = (
    "the model you were given did not change: train it in place (no copy), calling "
    "optimizer.step() after loss.backward() at every step."
)
TRAIN_MISTAKES = [
    Mistake(WHY_NO_ZERO_GRAD, _wrong_loop(zero_grad=False)),
    Mistake(WHY_NO_CLIP, _wrong_loop(clip=False)),
    Mistake(WHY_CONSTANT_LR, _wrong_loop(schedule=False)),
    Mistake(WHY_DECAY_ALL, _wrong_loop(decay_all=True)),
    Mistake(WHY_DEFAULT_BETAS, _wrong_loop(default_betas=True)),
    Mistake(WHY_SAME_BATCH, _wrong_loop(fresh_generator=True)),
    Mistake(WHY_NO_STEP, _wrong_loop(step=False)),
]

# a recipe whose every setting matters within a few steps: a short warm-up, strong clipping and decay
_TRAIN_RECIPE = LMRecipe(
    model=GPTConfig(vocab_size=11, block_size=8, n_layers=1, H=2, d_model=16, dropout=0.0),
    train=TrainConfig(
        max_steps=1000, lr=3e-2, warmup_steps=2, weight_decay=0.5, betas=(0.8, 0.95), grad_clip=0.3,
        eval_interval=10**9,
    ),
    batch_size=4,
)  # fmt: skip


def _train_case() -> list:
    g = torch.Generator().manual_seed(40)
    pattern = (torch.arange(400) * 3) % 11  # a periodic text with noise: its loss can fall
    noise = torch.randint(11, (400,), generator=g)
    ids = torch.where(torch.rand(400, generator=g) < 0.2, noise, pattern)
    return [(_TRAIN_RECIPE, ids, 6, 0)]


def _fresh_model(recipe: LMRecipe) -> PackageGPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return PackageGPT(recipe.model).double()


def _flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _observe_train(answer: Any, case: tuple) -> Output:
    recipe, ids, steps, seed = case
    model = _fresh_model(recipe)
    before = _flat(model)

    def next_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return get_batch(ids, recipe.model.block_size, recipe.batch_size, generator)

    losses = answer(model, next_batch, recipe, steps, seed)
    try:
        losses = torch.as_tensor([float(v) for v in losses], dtype=torch.float64)
    except (TypeError, ValueError):
        raise _Verdict(
            f"train_loop must return the list of the {steps} training losses (loss.item() at each "
            f"step), got a {type(losses).__name__}."
        ) from None
    if len(losses) != steps:
        raise _Verdict(f"train_loop returned {len(losses)} losses for {steps} steps; one per step.")
    after = _flat(model)
    if torch.equal(before, after):
        raise _Verdict(WHY_NO_STEP)
    return {"the training losses": losses, "the parameters after training": after}


def _expected_train(case: tuple) -> Output:
    recipe, ids, steps, seed = case
    model = _fresh_model(recipe)
    cfg = recipe.with_steps(steps).train
    hist = train(
        model,
        lambda g: get_batch(ids, recipe.model.block_size, recipe.batch_size, g),
        lambda m, batch: m(*batch)[1],
        dataclasses.replace(cfg, seed=seed),
        evaluate=None,
        progress=False,
    )
    return {
        "the training losses": torch.tensor(hist.train_loss, dtype=torch.float64),
        "the parameters after training": _flat(model),
    }


def _locate_train(answer: Any, case: tuple) -> str | None:
    got, expected = _observe_train(answer, case), _expected_train(case)
    key = "the training losses"
    if torch.allclose(got[key], expected[key], atol=1e-6, rtol=1e-5):
        return (
            "your losses match the package's loop, but the parameters after training do not: train "
            "the model you were given, in place."
        )
    first = int((~torch.isclose(got[key], expected[key], atol=1e-6, rtol=1e-5)).nonzero()[0])
    return (
        f"your losses follow the package's loop (tc.train.train) until step {first}, then differ "
        f"(you: {got[key][first]:.6g}, expected: {expected[key][first]:.6g}); compare the step's order: "
        "learning rate, batch, loss, zero_grad, backward, clip, step."
    )


_register(
    CapstoneExercise(
        name="language_models.train_loop",
        prompt=(
            "Write train_loop(model, next_batch, recipe, steps, seed=0): train model in place for steps "
            "steps with the recipe's settings (AdamW with its betas and weight decay on the matrices, "
            "the learning rate lr_at(step, cfg) of the schedule stretched over steps, gradient "
            "clipping), batches from next_batch(generator) with one generator seeded with seed; "
            "return the list of the training losses."
        ),
        solution=train_loop,
        mistakes=TRAIN_MISTAKES,
        cases=_train_case,
        observe=_observe_train,
        expected=_expected_train,
        locate=_locate_train,
        describe=lambda case: (
            f"case: the package's GPT ({_sizes_of(case[0].model)}), {case[2]} steps"
        ),
        kind="function",
        atol=1e-6,
        rtol=1e-5,
        passed="the losses and the trained weights match the package's loop (tc.train.train)",
    )
)


# --------------------------------------------------------------------------------------------------
# 7. Generation


def generate(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
    """Extend `idx` (B, T) by `max_new_tokens` tokens, each chosen from the model's last logits."""
    C = model.config.block_size
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(idx[:, -C:])[0][:, -1]  # (B, V): the last position predicts the next
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
                nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)  # (B, T + 1)
    return idx


def _wrong_generate(
    position: int = -1,
    crop: str = "last",
    only_new: bool = False,
    last_token: bool = False,
    tau: str = "divide",
    uses_generator: bool = True,
) -> Callable:
    """A generation loop with one typical mistake."""

    def wrong(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        C, T = model.config.block_size, idx.shape[1]
        with torch.no_grad():
            for _ in range(max_new_tokens):
                seen = {"last": idx[:, -C:], "first": idx[:, :C], "none": idx}[crop]
                logits = model(seen[:, -1:] if last_token else seen)[0][:, position]
                if greedy:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    scaled = {"divide": logits / temperature, "times": logits * temperature}
                    z = scaled.get(tau, logits)  # tau="ignore": the temperature is left out
                    nxt = torch.multinomial(
                        torch.softmax(z, dim=-1), 1, generator=generator if uses_generator else None
                    )
                idx = torch.cat([idx, nxt], dim=1)
        return idx[:, T:] if only_new else idx

    return wrong


WHY_GEN_FIRST_POSITION = (
    "you chose the next token from the first position's logits; the prediction of the next token is "
    "at the last position, logits[:, -1]."
)
WHY_GEN_NO_CROP = (
    "you fed more tokens than the context holds: crop the sequence to its last block_size tokens, "
    "idx[:, -block_size:], before each forward pass."
)
WHY_GEN_CROP_START = (
    "you cropped the sequence to its first block_size tokens; keep the last ones, "
    "idx[:, -block_size:], so that the model sees the most recent context."
)
WHY_GEN_ONLY_NEW = (
    "you returned only the new tokens; return the prompt followed by them, shape "
    "(B, T + max_new_tokens)."
)
WHY_GEN_LAST_TOKEN = (
    "you fed only the newest token to the model, so it predicts from one token of context; without a "
    "cache, feed the whole (cropped) sequence."
)
WHY_GEN_TEMPERATURE_TIMES = (
    "you multiplied the logits by the temperature; divide them, softmax(logits / temperature), so "
    "that a low temperature sharpens the distribution."
)
WHY_GEN_TEMPERATURE_IGNORED = (
    "your samples ignore the temperature: sample from softmax(logits / temperature)."
)
WHY_GEN_IGNORES_GENERATOR = (
    "your samples ignore the generator: the same seed must give the same text, "
    "torch.multinomial(probs, 1, generator=generator)."
)
GENERATE_MISTAKES = [
    Mistake(WHY_GEN_FIRST_POSITION, _wrong_generate(position=0)),
    Mistake(WHY_GEN_NO_CROP, _wrong_generate(crop="none")),
    Mistake(WHY_GEN_CROP_START, _wrong_generate(crop="first")),
    Mistake(WHY_GEN_ONLY_NEW, _wrong_generate(only_new=True)),
    Mistake(WHY_GEN_LAST_TOKEN, _wrong_generate(last_token=True)),
    Mistake(WHY_GEN_TEMPERATURE_TIMES, _wrong_generate(tau="times")),
    Mistake(WHY_GEN_TEMPERATURE_IGNORED, _wrong_generate(tau="ignore")),
    Mistake(WHY_GEN_IGNORES_GENERATOR, _wrong_generate(uses_generator=False)),
]


def _generate_cases() -> list:
    c0, c1 = _CONFIGS
    g = torch.Generator().manual_seed(50)
    return [  # (config, prompt, new tokens, options); "package": compare with tc's generate
        (c0, torch.randint(c0.vocab_size, (2, 3), generator=g), c0.block_size - 3,
         {"greedy": True, "package": True}),
        (c1, torch.randint(c1.vocab_size, (1, 4), generator=g), c1.block_size + 3, {"greedy": True}),
        (c0, torch.randint(c0.vocab_size, (2, 2), generator=g), 2 * c0.block_size,
         {"temperature": 2.0, "seed": 7}),
    ]  # fmt: skip


def _generated(answer: Any, model: nn.Module, idx: Tensor, n: int, options: dict) -> Tensor:
    seed = options.get("seed")
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    kwargs = {"greedy": options.get("greedy", False), "generator": generator}
    out = answer(model, idx.clone(), n, options.get("temperature", 1.0), **kwargs)
    return _tensor(out, "generate")


def _observe_generate(answer: Any, case: tuple) -> Output:
    config, idx, n, options = case
    model = copy.deepcopy(package_gpt(config))  # the answer may change its mode or its device
    out = _generated(answer, model, idx, n, options)
    if options.get("seed") is not None:
        again = _generated(answer, model, idx, n, options)
        if again.shape != out.shape or not torch.equal(again, out):
            raise _Verdict(WHY_GEN_IGNORES_GENERATOR)
    return {"the tokens": out}


def _expected_generate(case: tuple) -> Output:
    config, idx, n, options = case
    if options.get("package"):  # inside the context: tc's generate, without its cache
        out = package_generate(package_gpt(config), idx, n, greedy=True, use_cache=False)
        return {"the tokens": out}
    return _observe_generate(generate, case)


def _describe_generation(case: tuple) -> str:
    config, idx, n, options = case
    how = "greedy" if options.get("greedy") else f"temperature {options['temperature']}, seeded"
    return f"case: {_sizes_of(config)}; prompt {tuple(idx.shape)}, {n} new tokens, {how}"


_register(
    CapstoneExercise(
        name="language_models.generate",
        prompt=(
            "Write generate(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None): "
            "extend idx (B, T) one token at a time, feeding the model the last block_size tokens and "
            "choosing the next token from the last position's logits, the arg-max when greedy, else "
            "a sample of softmax(logits / temperature) drawn with the generator; return "
            "(B, T + max_new_tokens)."
        ),
        solution=generate,
        mistakes=GENERATE_MISTAKES,
        cases=_generate_cases,
        observe=_observe_generate,
        expected=_expected_generate,
        describe=_describe_generation,
        kind="function",
        atol=0.0,
        rtol=0.0,
        passed="the same tokens as the package's generate (greedy) and as the reference (sampled)",
    )
)


# --------------------------------------------------------------------------------------------------
# 8. The key-value cache


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer, (B, H, M, d_k) each."""

    def __init__(self):
        self.K = self.V = None  # nothing cached yet

    def __len__(self):
        return 0 if self.K is None else self.K.shape[2]  # M, the positions cached

    def update(self, K_new, V_new):
        if self.K is None:
            self.K, self.V = K_new, V_new
        else:
            self.K = torch.cat([self.K, K_new], dim=2)  # (B, H, M + n, d_k): along the positions
            self.V = torch.cat([self.V, V_new], dim=2)
        return self.K, self.V


class _Cache(KVCache):
    """Wrong caches: one attribute per mistake."""

    axis = 2  # the axis the cache grows along
    returns_all = keeps = True
    counts_updates = keys_twice = new_first = False

    def __init__(self):
        super().__init__()
        self.updates = 0

    def __len__(self):
        return self.updates if self.counts_updates else super().__len__()

    def update(self, K_new, V_new):
        self.updates += 1
        if self.K is None or not self.keeps:
            self.K, self.V = K_new, V_new
        else:
            if self.new_first:
                self.K = torch.cat([K_new, self.K], dim=self.axis)
                self.V = torch.cat([V_new, self.V], dim=self.axis)
            else:
                self.K = torch.cat([self.K, K_new], dim=self.axis)
                self.V = torch.cat([self.V, V_new], dim=self.axis)
        K, V = (self.K, self.V) if self.returns_all else (K_new, V_new)
        return (K, K) if self.keys_twice else (K, V)


WHY_CACHE_HEADS_AXIS = (
    "you concatenated along the heads (dim=1); the cache grows along the positions, dim=2 of "
    "(B, H, M, d_k)."
)
WHY_CACHE_ONLY_NEW = (
    "update returned only the new keys and values; it returns every position so far, the cached "
    "ones followed by the new ones."
)
WHY_CACHE_COUNTS_UPDATES = (
    "len(cache) counts your calls to update; it is the number of positions cached (a prompt of 3 "
    "tokens adds 3), which GPT.forward uses as the next position."
)
WHY_CACHE_KEYS_TWICE = "update returned the keys twice; return (K, V)."
WHY_CACHE_NEW_FIRST = (
    "you put the new keys and values before the cached ones; the earlier positions come first, "
    "torch.cat([old, new], dim=2)."
)
WHY_CACHE_OVERWRITES = (
    "your cache keeps only the latest update: concatenate the new keys and values to the cached ones "
    "instead of replacing them."
)
CACHE_MISTAKES = [
    Mistake(WHY_CACHE_HEADS_AXIS, _variant(_Cache, "_HeadsAxis", axis=1)),
    Mistake(WHY_CACHE_ONLY_NEW, _variant(_Cache, "_OnlyNew", returns_all=False)),
    Mistake(WHY_CACHE_COUNTS_UPDATES, _variant(_Cache, "_CountsUpdates", counts_updates=True)),
    Mistake(WHY_CACHE_KEYS_TWICE, _variant(_Cache, "_KeysTwice", keys_twice=True)),
    Mistake(WHY_CACHE_NEW_FIRST, _variant(_Cache, "_NewFirst", new_first=True)),
    Mistake(WHY_CACHE_OVERWRITES, _variant(_Cache, "_Overwrites", keeps=False)),
]


def _observe_cache(answer: Any, case: tuple) -> Output:
    B, H, d_k, chunks = case
    g = torch.Generator().manual_seed(60)
    cache = answer()
    lengths, out = [len(cache)], {}
    for k, n in enumerate(chunks):
        K, V = cache.update(randn(g, B, H, n, d_k), randn(g, B, H, n, d_k))
        out[f"K after update {k + 1}"] = _tensor(K, "update")
        out[f"V after update {k + 1}"] = _tensor(V, "update")
        lengths.append(len(cache))
    return {"len(cache) before and after each update": torch.tensor(lengths), **out}


_register(
    CapstoneExercise(
        name="language_models.kv_cache",
        prompt=(
            "Write the class KVCache(): update(K_new, V_new), with the new tokens' keys and values "
            "(B, H, n, d_k), appends them after the cached ones and returns all keys and values so "
            "far, (B, H, M, d_k) each; len(cache) is M, the number of positions cached."
        ),
        solution=KVCache,
        mistakes=CACHE_MISTAKES,
        cases=lambda: [(2, 3, 4, (3, 1, 2))],
        observe=_observe_cache,
        describe=lambda case: (
            f"case: B={case[0]}, H={case[1]}, d_k={case[2]}; updates of {case[3]} tokens"
        ),
        atol=0.0,
        rtol=0.0,
        passed="matches the reference cache",
    )
)


# --------------------------------------------------------------------------------------------------
# 9. The model with a cache, and cached generation


WHY_MASK_NOT_OFFSET = (
    "with a cache your causal mask starts at the first key instead of ending at the last: the N new "
    "queries are the last N of the M positions, so query n may see the keys m <= M - N + n (mask "
    "torch.ones(N, M).triu(M - N + 1)). F.scaled_dot_product_attention(is_causal=True) aligns its "
    "mask to the top left and makes this mistake whenever N != M."
)
WHY_IGNORES_CACHE = (
    "your attention ignores the cache: call K, V = cache.update(K, V) after computing the new tokens' "
    "keys and values, so that the queries also see the earlier tokens."
)
WHY_NO_MASK_WITH_CACHE = (
    "with a cache you dropped the causal mask, but a prompt goes through in one piece: its tokens "
    "must not see the ones after them (only a single new token needs no mask)."
)
WHY_ONE_CACHE = (
    "every block used the same cache; each block caches its own keys and values: pass caches[l] to "
    "block l."
)
CACHED_MISTAKES = [
    Mistake(WHY_IGNORES_START, _variant(_GPT, "_GPTIgnoresStart", embedding=_IgnoresStart)),
    Mistake(
        WHY_MASK_NOT_OFFSET,
        _variant(_GPT, "_GPTTopLeft", attention=_variant(_Attention, "_TopLeft", mask="top_left")),
    ),
    Mistake(
        WHY_IGNORES_CACHE,
        _variant(_GPT, "_GPTNoCache", attention=_variant(_Attention, "_NoCache", uses_cache=False)),
    ),
    Mistake(
        WHY_NO_MASK_WITH_CACHE,
        _variant(
            _GPT,
            "_GPTNoMaskCached",
            attention=_variant(_Attention, "_NoMaskCached", mask="not_with_cache"),
        ),
    ),
    Mistake(WHY_ONE_CACHE, _variant(_GPT, "_GPTOneCache", one_cache=True)),
]


def _cached_cases() -> list:
    cases = []
    for k, (config, chunks) in enumerate(zip(_CONFIGS, ((3, 1, 2, 1, 2), (3, 1, 2)), strict=True)):
        g = torch.Generator().manual_seed(70 + k)
        cases.append(
            (config, torch.randint(config.vocab_size, (2, sum(chunks)), generator=g), chunks)
        )
    return cases


def _observe_cached(answer: Any, case: tuple) -> Output:
    config, idx, chunks = case
    model = _build(answer, config, lab_state_dict(package_gpt(config)), "GPT")
    with torch.no_grad():
        whole = _logits_and_loss(model(idx))[0]
        if whole.shape != (*idx.shape, config.vocab_size) or not torch.allclose(
            whole, package_gpt(config)(idx)[0], atol=1e-6, rtol=1e-6
        ):
            raise _Verdict(
                "without a cache your model's logits already differ from the package's: pass "
                "language_models.gpt first."
            )
        caches = [KVCache() for _ in range(config.n_layers)]  # the reference cache
        pieces, start = [], 0
        for n in chunks:
            pieces.append(_logits_and_loss(model(idx[:, start : start + n], caches=caches))[0])
            start += n
    return {"the logits, fed piece by piece through the caches": torch.cat(pieces, dim=1)}


def _expected_cached(case: tuple) -> Output:
    config, idx, _ = case
    with torch.no_grad():
        return {"the logits, fed piece by piece through the caches": package_gpt(config)(idx)[0]}


_register(
    CapstoneExercise(
        name="language_models.gpt_cached",
        prompt=(
            "Make your GPT work with caches: given one KVCache per block, forward(idx, caches=caches) "
            "takes only the new tokens, places them at positions len(caches[0]) onwards, and each "
            "attention layer appends their keys and values to its cache and lets the new queries "
            "attend to every position up to their own; fed piece by piece, the logits equal one "
            "pass over the whole sequence."
        ),
        solution=GPT,
        mistakes=CACHED_MISTAKES,
        cases=_cached_cases,
        observe=_observe_cached,
        expected=_expected_cached,
        describe=lambda case: f"case: {_sizes_of(case[0])}; pieces of {case[2]} tokens",
        atol=1e-6,
        rtol=1e-6,
        passed="fed piece by piece through a cache, the logits equal one uncached pass",
    )
)


def generate_cached(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
    """As `generate`, with a KVCache per block: the prompt goes through once, then one token a step."""
    if idx.shape[1] + max_new_tokens > model.config.block_size:
        raise ValueError(
            f"{idx.shape[1]} + {max_new_tokens} tokens do not fit in the context of "
            f"{model.config.block_size}: a cache cannot hold more (the package restarts its window)"
        )
    caches = [KVCache() for _ in range(model.config.n_layers)]
    with torch.no_grad():
        logits = model(idx, caches=caches)[0][:, -1]  # the whole prompt, once: (B, V)
        for _ in range(max_new_tokens):
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)
                nxt = torch.multinomial(probs.cpu(), 1, generator=generator).to(idx.device)
            idx = torch.cat([idx, nxt], dim=1)
            logits = model(nxt, caches=caches)[0][:, -1]  # only the newest token goes through
    return idx


def _wrong_cached(feed="new", use_caches=True, first=False, shared=False) -> Callable:
    """Cached generation with one typical mistake."""

    def wrong(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        n_layers = model.config.n_layers
        caches = [KVCache()] * n_layers if shared else [KVCache() for _ in range(n_layers)]
        with torch.no_grad():
            logits = model(idx, caches=caches)[0][:, 0 if first else -1]
            for _ in range(max_new_tokens):
                if greedy:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    nxt = torch.multinomial(
                        torch.softmax(logits / temperature, dim=-1), 1, generator=generator
                    )
                idx = torch.cat([idx, nxt], dim=1)
                fed = {"new": nxt, "all": idx, "previous": idx[:, -2:-1]}[feed]
                logits = model(fed, caches=caches if use_caches else None)[0][:, -1]
        return idx

    return wrong


WHY_CACHED_RESENDS = (
    "with a cache, feed only the new token after the prompt: you ran the whole sequence through the "
    "model again, so its keys and values were cached twice."
)
WHY_CACHED_NO_CACHES = (
    "after the prompt you ran the newest token through the model without the caches, so it saw one "
    "token of context; pass caches=caches at every step."
)
WHY_CACHED_FIRST_POSITION = (
    "the first new token was chosen from the first position of the prompt's logits; use the last "
    "position, logits[:, -1]."
)
WHY_CACHED_PREVIOUS_TOKEN = (
    "after appending the chosen token you fed the token before it; feed the new token, idx[:, -1:]."
)
WHY_CACHED_SHARED = (
    "`[KVCache()] * n_layers` is one cache shared by every block (the list holds the same object "
    "n_layers times); build one per block, [KVCache() for _ in range(n_layers)]."
)
GENERATE_CACHED_MISTAKES = [
    Mistake(WHY_CACHED_RESENDS, _wrong_cached(feed="all")),
    Mistake(WHY_CACHED_NO_CACHES, _wrong_cached(use_caches=False)),
    Mistake(WHY_CACHED_FIRST_POSITION, _wrong_cached(first=True)),
    Mistake(WHY_CACHED_PREVIOUS_TOKEN, _wrong_cached(feed="previous")),
    Mistake(WHY_CACHED_SHARED, _wrong_cached(shared=True)),
]


def _generate_cached_cases() -> list:
    c0, c1 = _CONFIGS
    g = torch.Generator().manual_seed(80)
    return [
        (c0, torch.randint(c0.vocab_size, (2, 3), generator=g), c0.block_size - 3, {"greedy": True}),
        (c1, torch.randint(c1.vocab_size, (2, 2), generator=g), c1.block_size - 2,
         {"temperature": 0.8, "seed": 3}),
    ]  # fmt: skip


def _expected_generate_cached(case: tuple) -> Output:
    """Without a cache, the same tokens: tc's generate when greedy, the reference `generate` else."""
    config, idx, n, options = case
    if options.get("greedy"):
        out = package_generate(package_gpt(config), idx, n, greedy=True, use_cache=False)
        return {"the tokens": out}
    return _observe_generate(generate, case)


_register(
    CapstoneExercise(
        name="language_models.generate_cached",
        prompt=(
            "Write generate_cached(model, idx, max_new_tokens, temperature=1.0, greedy=False, "
            "generator=None), generate with one KVCache per block: the prompt goes through the model "
            "once, then only each new token; the tokens equal those of generate without a cache "
            "(prompt and new tokens must fit in the context)."
        ),
        solution=generate_cached,
        mistakes=GENERATE_CACHED_MISTAKES,
        cases=_generate_cached_cases,
        observe=_observe_generate,
        expected=_expected_generate_cached,
        describe=_describe_generation,
        kind="function",
        atol=0.0,
        rtol=0.0,
        passed="the same tokens as generation without a cache",
    )
)
