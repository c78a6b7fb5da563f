"""Exercises of the *Multi-head self-attention* lab: splitting and merging heads, multi-head
attention from its weights, the whole layer as an ``nn.Module`` in about 20 lines (checked with the
package's weights loaded into it), Turner's low-rank output maps ``U_o,h`` (his ``V_h``), and the
parameter count of both forms.

Chapter: *Multi-head self-attention* (Turner 2023 eq. 4-6 and footnotes 11-13; the lecture notes on
Bishop & Bishop 2024, ``bishop2024notes``, sec. 2.11, Algorithm 2 and exercise 5 in their own numbering;
MIT 6.390 sec. 9.4.2). Rows are tokens; head ``h`` owns the contiguous feature block
``h*d_k : (h+1)*d_k`` (columns of ``W_q, W_k, W_v``, rows of ``W_o``), as in
:mod:`transformer_course.multihead`. Inputs are float64 so the checkers can use tight tolerances.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..multihead import SelfAttention
from . import _REGISTRY, ClassExercise, Exercise, Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. Split the features of every token into H heads

_SPLIT_SIZES = ((2, 5, 2, 3), (1, 4, 3, 2), (3, 6, 4, 3))  # (B, N, H, d) per trial


def _split_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    B, N, H, d = _SPLIT_SIZES[trial % 3]
    return randn(gen, B, N, H * d), H


@exercise(
    name="multihead.split_heads",
    prompt=(
        "Given T of shape (B, N, H*d) and the number of heads H, return shape (B, H, N, d) where "
        "head h holds the contiguous features h*d:(h+1)*d of every token: out[b, h, n] == "
        "T[b, n, h*d:(h+1)*d]. Use reshape and transpose (no loops)."
    ),
    make_inputs=_split_inputs,
    mistakes=[
        Mistake(
            "the heads are interleaved: reshape(B, N, d, H) gives head h the features h, h+H, h+2H, ...; "
            "head h owns the contiguous block h*d:(h+1)*d, so reshape to (B, N, H, d) and then swap "
            "N and H.",
            lambda T, H: T.reshape(*T.shape[:2], T.shape[-1] // H, H).permute(0, 3, 1, 2),
        ),
        Mistake(
            "the transpose is missing: reshaping straight to (B, H, N, d) cuts the memory of T into H "
            "chunks of consecutive tokens, not of features; reshape to (B, N, H, d) first, then "
            ".transpose(1, 2).",
            lambda T, H: T.reshape(T.shape[0], H, T.shape[1], T.shape[-1] // H),
        ),
    ],
)
def split_heads(T: Tensor, H: int) -> Tensor:
    B, N, HD = T.shape
    return T.reshape(B, N, H, HD // H).transpose(1, 2)  # (B, N, H, d) -> (B, H, N, d)


# ---------------------------------------------------------------------------------------------------
# 2. Merge (concatenate) the heads again


def _merge_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor]:
    B, N, H, d = _SPLIT_SIZES[trial % 3]
    return (randn(gen, B, H, N, d),)


@exercise(
    name="multihead.merge_heads",
    prompt=(
        "Given the heads' outputs T of shape (B, H, N, d), return their concatenation along the "
        "features, shape (B, N, H*d): out[b, n, h*d:(h+1)*d] == T[b, h, n]. This is the inverse "
        "of split_heads."
    ),
    make_inputs=_merge_inputs,
    mistakes=[
        Mistake(
            "the transpose is missing: reshaping (B, H, N, d) straight to (B, N, H*d) glues rows of "
            "different tokens together; move H next to d first (.transpose(1, 2)), then reshape.",
            lambda T: T.reshape(T.shape[0], T.shape[2], -1),
        ),
        Mistake(
            "the heads are interleaved: you put H after d (permute(0, 2, 3, 1)), so the features of "
            "all heads alternate; concatenation puts head h's d features in the block h*d:(h+1)*d, "
            "i.e. order (B, N, H, d) before the reshape.",
            lambda T: T.permute(0, 2, 3, 1).reshape(T.shape[0], T.shape[2], -1),
        ),
    ],
)
def merge_heads(T: Tensor) -> Tensor:
    B, H, N, d = T.shape
    return T.transpose(1, 2).reshape(B, N, H * d)  # (B, N, H, d) -> (B, N, H*d)


# ---------------------------------------------------------------------------------------------------
# 3. Multi-head self-attention from its four weight matrices

_MHA_SIZES = ((5, 6, 2), (4, 8, 4), (7, 9, 3))  # (N, D, H) per trial


def _mha_inputs(
    gen: torch.Generator, trial: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, int]:
    N, D, H = _MHA_SIZES[trial % 3]
    W_q, W_k, W_v, W_o = (randn(gen, D, D) / math.sqrt(D) for _ in range(4))  # scores of order one
    return randn(gen, N, D), W_q, W_k, W_v, W_o, H


def _heads(X: Tensor, W: Tensor, H: int) -> Tensor:
    N, D = X.shape
    return (X @ W).reshape(N, H, D // H).transpose(0, 1)  # (H, N, d_k)


def _mha_from_heads(Q: Tensor, K: Tensor, V: Tensor, W_o: Tensor, scale: float, dim: int = -1):
    A = torch.softmax(Q @ K.transpose(-2, -1) * scale, dim=dim)  # (H, N, N)
    heads = A @ V  # (H, N, d_k)
    return heads.transpose(0, 1).reshape(Q.shape[1], -1) @ W_o  # (N, D)


def _mha_scale_sqrt_D(X, W_q, W_k, W_v, W_o, H):
    D = X.shape[1]
    return _mha_from_heads(*(_heads(X, W, H) for W in (W_q, W_k, W_v)), W_o, 1 / math.sqrt(D))


def _mha_interleaved(X, W_q, W_k, W_v, W_o, H):
    N, D = X.shape
    Q, K, V = ((X @ W).reshape(N, D // H, H).permute(2, 0, 1) for W in (W_q, W_k, W_v))
    heads = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(D // H), dim=-1) @ V  # (H, N, d_k)
    return heads.permute(1, 2, 0).reshape(N, D) @ W_o  # merged back the same (wrong) way


def _mha_no_W_o(X, W_q, W_k, W_v, W_o, H):
    return multi_head_attention(X, W_q, W_k, W_v, torch.eye(X.shape[1], dtype=X.dtype), H)


def _mha_one_head(X, W_q, W_k, W_v, W_o, H):
    return multi_head_attention(X, W_q, W_k, W_v, W_o, 1)


def _mha_wrong_axis(X, W_q, W_k, W_v, W_o, H):
    scale = 1 / math.sqrt(X.shape[1] // H)
    return _mha_from_heads(*(_heads(X, W, H) for W in (W_q, W_k, W_v)), W_o, scale, dim=-2)


def _mha_W_o_transposed(X, W_q, W_k, W_v, W_o, H):
    return multi_head_attention(X, W_q, W_k, W_v, W_o.T, H)


@exercise(
    name="multihead.attention",
    prompt=(
        "Multi-head self-attention in the concat form: X is (N, D); W_q, W_k, W_v, W_o are (D, D); "
        "H divides D and d_k = D / H. Head h uses columns h*d_k:(h+1)*d_k of W_q, W_k, W_v: "
        "head_h = softmax(Q_h K_h^T / sqrt(d_k)) V_h (softmax over each row). Return "
        "Y = [head_1, ..., head_H] @ W_o of shape (N, D)."
    ),
    make_inputs=_mha_inputs,
    mistakes=[
        Mistake(
            "the scale uses the model width: divide the scores by sqrt(d_k) with d_k = D / H, the width "
            "of one head, not by sqrt(D).",
            _mha_scale_sqrt_D,
        ),
        Mistake(
            "the heads are interleaved (a reshape to (N, d_k, H)): head h must use the contiguous "
            "columns h*d_k:(h+1)*d_k of W_q, W_k and W_v; reshape to (N, H, d_k).",
            _mha_interleaved,
        ),
        Mistake(
            "W_o is missing: after concatenating the heads, multiply by the output map W_o.",
            _mha_no_W_o,
        ),
        Mistake(
            "you computed a single head of width D (H was ignored): split Q, K, V into H heads of "
            "width D / H, each with its own softmax.",
            _mha_one_head,
        ),
        Mistake(
            "the softmax normalised over the queries (dim=-2); each query's row of A_h must sum to one "
            "(dim=-1).",
            _mha_wrong_axis,
        ),
        Mistake(
            "W_o is used transposed: the concatenation (N, H*d_k) multiplies W_o (H*d_k, D) from the "
            "left, concat @ W_o, not concat @ W_o.T.",
            _mha_W_o_transposed,
        ),
    ],
)
def multi_head_attention(
    X: Tensor, W_q: Tensor, W_k: Tensor, W_v: Tensor, W_o: Tensor, H: int
) -> Tensor:
    D = X.shape[1]
    d_k = D // H
    heads = []
    for h in range(H):
        cols = slice(h * d_k, (h + 1) * d_k)  # head h's block of features
        Q_h, K_h, V_h = X @ W_q[:, cols], X @ W_k[:, cols], X @ W_v[:, cols]  # (N, d_k) each
        A_h = torch.softmax(Q_h @ K_h.T / math.sqrt(d_k), dim=-1)  # (N, N), rows sum to one
        heads.append(A_h @ V_h)  # (N, d_k)
    return torch.cat(heads, dim=-1) @ W_o  # (N, H*d_k) @ (H*d_k, D) -> (N, D)


# ---------------------------------------------------------------------------------------------------
# 4. The layer itself: an nn.Module with four nn.Linear maps (about 20 lines)
#
# The learner writes a class with fixed parameter names (W_q, W_k, W_v, W_o, each nn.Linear(D, D)). The
# checker builds it as answer(D, H), loads the weights of a seeded package layer, tc.multihead.
# SelfAttention, into it by those names (lab_state_dict), runs both on the same batch and compares. Each
# typical mistake is a small subclass of the reference solution that changes one thing, run with the
# same weights; the first one whose output equals the learner's names what is wrong.

_LAYER_SIZES = ((2, 5, 6, 2), (1, 7, 12, 3), (3, 4, 8, 4))  # (B, N, D, H): N != D, d_k = 3, 4, 2
LAB_NAMES = tuple(f"{W}.{p}" for W in ("W_q", "W_k", "W_v", "W_o") for p in ("weight", "bias"))


def lab_state_dict(layer: SelfAttention) -> dict[str, Tensor]:
    """The weights of the package's layer under the lab's names.

    ``SelfAttention`` stacks the three input maps in one ``in_proj = nn.Linear(D, 3D)``; the lab's layer
    has one ``nn.Linear(D, D)`` each. So ``W_q.weight`` is rows ``0:D`` of ``in_proj.weight`` (the
    course's ``W_q`` transposed: ``nn.Linear`` stores ``(out, in)``), ``W_k.weight`` rows ``D:2D``,
    ``W_v.weight`` rows ``2D:3D``, the biases likewise, and ``W_o`` is ``out_proj``.
    """
    D = layer.d_model
    weights = layer.in_proj.weight.detach().split(D, dim=0)  # (D, D) each: W_q^T, W_k^T, W_v^T
    biases = layer.in_proj.bias.detach().split(D)  # (D,) each
    state = {}
    for name, W, b in zip(("W_q", "W_k", "W_v"), weights, biases, strict=True):
        state[f"{name}.weight"], state[f"{name}.bias"] = W, b
    state["W_o.weight"] = layer.out_proj.weight.detach()  # W_o^T
    state["W_o.bias"] = layer.out_proj.bias.detach()
    return state


def _layer_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, SelfAttention]:
    """A batch X (B, N, D) and the package's layer with seeded weights, in float64.

    Weights are N(0, 1/D) and biases N(0, 0.2^2): the scores are of order one, so no softmax saturates
    and every mistake below changes the output clearly (tests/test_multihead.py proves it).
    """
    B, N, D, H = _LAYER_SIZES[trial % 3]
    with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten below
        layer = SelfAttention(D, H).double().eval().requires_grad_(False)
    for p in layer.parameters():
        p.copy_(randn(gen, *p.shape) / math.sqrt(D) if p.dim() == 2 else 0.2 * randn(gen, *p.shape))
    return randn(gen, B, N, D), layer


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, D, H):
        super().__init__()
        self.H, self.d_k = H, D // H  # H heads of width d_k
        self.W_q = nn.Linear(D, D)  # the H query maps side by side (nn.Linear stores W_q^T)
        self.W_k = nn.Linear(D, D)  # the H key maps
        self.W_v = nn.Linear(D, D)  # the H value maps
        self.W_o = nn.Linear(D, D)  # the output map, applied to the concatenated heads

    def forward(self, X):
        B, N, D = X.shape

        def split(T):  # (B, N, D) -> (B, N, H, d_k) -> (B, H, N, d_k): head h gets its d_k features
            return T.view(B, N, self.H, self.d_k).transpose(1, 2)

        Q, K, V = split(self.W_q(X)), split(self.W_k(X)), split(self.W_v(X))
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, N, N): one score matrix per head
        A = torch.softmax(S, dim=-1)  # each query's weights over the keys sum to one
        heads = A @ V  # (B, H, N, d_k)
        concat = heads.transpose(1, 2).reshape(B, N, D)  # [head_1, ..., head_H]: (B, N, H d_k)
        return self.W_o(concat)  # (B, N, D)


class _Layer(MultiHeadSelfAttention):
    """Wrong layers: the reference's parameters, and one class attribute per mistake."""

    split = merge = "heads"  # "no_transpose": a reshape alone; "interleaved": (B, N, d_k, H)
    scale = "d_k"  # "D" or "none"
    softmax_dim = -1
    one_head = False  # H ignored: one head of width D
    out = "linear"  # "none", "untransposed" (concat @ W_o.weight), "bias_per_head"
    raw_weights = False  # every map as X @ W.weight + W.bias (nn.Linear's weight untransposed)

    def forward(self, X):
        B, N, D = X.shape
        H = 1 if self.one_head else self.H
        d_k = D // H
        maps = (self.W_q, self.W_k, self.W_v)
        if self.raw_weights:
            Q, K, V = (X @ W.weight + W.bias for W in maps)
        else:
            Q, K, V = (W(X) for W in maps)
        split = {
            "heads": lambda T: T.reshape(B, N, H, d_k).transpose(1, 2),
            "no_transpose": lambda T: T.reshape(B, H, N, d_k),
            "interleaved": lambda T: T.reshape(B, N, d_k, H).permute(0, 3, 1, 2),
        }[self.split]
        Q, K, V = split(Q), split(K), split(V)  # (B, H, N, d_k) each
        width = {"d_k": d_k, "D": D, "none": 1}[self.scale]
        A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(width), dim=self.softmax_dim)
        heads = A @ V  # (B, H, N, d_k)
        concat = {
            "heads": lambda: heads.transpose(1, 2).reshape(B, N, D),
            "no_transpose": lambda: heads.reshape(B, N, D),
            "interleaved": lambda: heads.permute(0, 2, 3, 1).reshape(B, N, D),
        }[self.merge]()
        W_o = self.W_o
        if self.out == "none":
            return concat
        if self.out == "untransposed" or self.raw_weights:
            return concat @ W_o.weight + W_o.bias
        if self.out == "bias_per_head":
            blocks = [slice(h * d_k, (h + 1) * d_k) for h in range(H)]
            return sum(
                F.linear(heads[:, h], W_o.weight[:, s], W_o.bias) for h, s in enumerate(blocks)
            )
        return W_o(concat)


def _wrong(name: str, **attrs: Any) -> type:
    """A subclass of :class:`_Layer` with some attributes changed: one typical mistake."""
    return type(name, (_Layer,), attrs)


LAYER_MISTAKES = [
    Mistake(
        "the heads are split by a reshape alone: .view(B, H, N, d_k) cuts each sequence's memory into "
        "H chunks of consecutive tokens, so a row of a head mixes features of different tokens. View "
        "as (B, N, H, d_k) first, then .transpose(1, 2).",
        _wrong("SplitWithoutTranspose", split="no_transpose"),
    ),
    Mistake(
        "the heads are merged by a reshape alone: (B, H, N, d_k).reshape(B, N, D) glues rows of "
        "different tokens together. Transpose back to (B, N, H, d_k) first, then reshape to "
        "(B, N, D).",
        _wrong("MergeWithoutTranspose", merge="no_transpose"),
    ),
    Mistake(
        "the heads are split and merged by reshapes alone (.view(B, H, N, d_k), then "
        ".reshape(B, N, D)): the round trip restores the memory layout, but each head attends over "
        "rows that mix the tokens' features, not over the N tokens. Split with "
        ".view(B, N, H, d_k).transpose(1, 2) and merge with .transpose(1, 2).reshape(B, N, D).",
        _wrong("ReshapesOnly", split="no_transpose", merge="no_transpose"),
    ),
    Mistake(
        "the heads are interleaved: a view as (B, N, d_k, H) gives head h the features h, h+H, "
        "h+2H, ... Head h owns the contiguous block h*d_k:(h+1)*d_k of Q, K and V (and the same "
        "rows of W_o): view as (B, N, H, d_k).",
        _wrong("Interleaved", split="interleaved", merge="interleaved"),
    ),
    Mistake(
        "the heads are concatenated in the wrong order: merging (B, H, N, d_k) as (B, N, d_k, H) "
        "(permute(0, 2, 3, 1)) interleaves the heads' features. [head_1, ..., head_H] puts head h's "
        "d_k features at h*d_k:(h+1)*d_k: transpose to (B, N, H, d_k), then reshape.",
        _wrong("ConcatOrder", merge="interleaved"),
    ),
    Mistake(
        "the scores are scaled by 1/sqrt(D); the scale is 1/sqrt(d_k), with d_k = D / H the width "
        "of one head's queries and keys.",
        _wrong("ScaleByD", scale="D"),
    ),
    Mistake(
        "the scores are not scaled: divide each head's Q_h K_h^T by sqrt(d_k) before the softmax.",
        _wrong("NoScale", scale="none"),
    ),
    Mistake(
        "the softmax ran over the queries (dim=-2 of the (B, H, N, N) scores); each query's weights "
        "over the keys must sum to one: softmax over dim=-1.",
        _wrong("SoftmaxOverQueries", softmax_dim=-2),
    ),
    Mistake(
        "the softmax ran over the heads (dim=1 of the (B, H, N, N) scores); every head normalises "
        "each query's scores over the keys on its own: softmax over dim=-1.",
        _wrong("SoftmaxOverHeads", softmax_dim=1),
    ),
    Mistake(
        "you computed one head of width D (H is not used): split Q, K and V into H heads of width "
        "d_k = D / H, each with its own scores and softmax.",
        _wrong("OneHead", one_head=True),
    ),
    Mistake(
        "W_o is missing: after concatenating the heads, apply the output map, self.W_o(concat).",
        _wrong("NoOutputMap", out="none"),
    ),
    Mistake(
        "W_o's nn.Linear weight is used untransposed (concat @ self.W_o.weight), or per head with the "
        "wrong slice (rows h*d_k:(h+1)*d_k of self.W_o.weight): nn.Linear stores W_o^T, shape "
        "(out, in), and computes concat @ weight.T + bias. Call self.W_o(concat); head by head, "
        "head h meets the columns self.W_o.weight[:, h*d_k:(h+1)*d_k].",
        _wrong("OutputWeightUntransposed", out="untransposed"),
    ),
    Mistake(
        "the nn.Linear weights are used untransposed (X @ self.W_q.weight + self.W_q.bias, ...): "
        "nn.Linear stores the transpose of the course's W_q, shape (out, in), and computes "
        "X @ weight.T + bias. Call the maps: self.W_q(X), ..., self.W_o(concat).",
        _wrong("WeightsUntransposed", raw_weights=True),
    ),
    Mistake(
        "W_o is applied head by head and its bias added once per head (H times); the output map "
        "adds its bias once: apply self.W_o to the concatenation (or add the bias after summing "
        "the heads' products).",
        _wrong("BiasPerHead", out="bias_per_head"),
    ),
]


class _Verdict(Exception):
    """What is wrong with an answer, found before its output is compared."""


def _build(answer: Any, layer: SelfAttention) -> nn.Module:
    """``answer(D, H)`` in float64 and evaluation mode, with ``layer``'s weights loaded by name."""
    D, H = layer.d_model, layer.H
    module = answer(D, H)
    if not isinstance(module, nn.Module):
        raise _Verdict(
            f"MultiHeadSelfAttention(D, H) built a {type(module).__name__}, not an nn.Module: "
            "subclass nn.Module and call super().__init__() first."
        )
    own = {name: p.shape for name, p in module.named_parameters()}
    missing = [k for k in LAB_NAMES if k not in own]
    extra = [k for k in own if k not in LAB_NAMES]
    if missing or extra:
        said = [f"it has no parameter {_listed(missing)}"] if missing else []
        said += [f"it has parameters the checker does not know: {_listed(extra)}"] if extra else []
        raise _Verdict(
            f"your layer's parameters do not have the lab's names ({'; '.join(said)}). The checker "
            "loads the package's weights by name: make four maps self.W_q, self.W_k, self.W_v and "
            "self.W_o, each nn.Linear(D, D) with its bias, and no other parameters."
        )
    state = lab_state_dict(layer)
    for k, t in state.items():
        if own[k] != t.shape:
            raise _Verdict(
                f"{k} has shape {tuple(own[k])} but must be {tuple(t.shape)}: each map is "
                f"nn.Linear(D, D) with D = {D} (all H heads side by side)."
            )
    module = module.double().eval()
    module.load_state_dict(state, strict=False)  # every parameter is in state; buffers are kept
    return module


def _listed(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in names[:8]) + (" ..." if len(names) > 8 else "")


def _run(answer: Any, X: Tensor, layer: SelfAttention) -> Any:
    """The output of the layer that ``answer`` builds, with ``layer``'s weights, on ``X``."""
    module = _build(answer, layer)
    with torch.no_grad():
        return module(X.clone())


def _where(X: Tensor, layer: SelfAttention) -> str:
    B, N, D = X.shape
    return f"[case: X (B, N, D) = {(B, N, D)}, H = {layer.H}, d_k = {D // layer.H}]"


@dataclass
class LayerExercise(ClassExercise):
    """An exercise whose answer is a class: ``answer(D, H)`` must build an ``nn.Module`` with the
    parameter names :data:`LAB_NAMES`; it is run with the package's weights on ``trials`` seeded
    batches and compared with :class:`~transformer_course.multihead.SelfAttention`. A difference is
    explained by the first :class:`Mistake` (a wrong class) whose output equals the learner's, then
    by the generic diagnoses of :class:`Exercise` (wrong shape, NaN, largest error)."""

    example: str = "MultiHeadSelfAttention"

    def _check_answer(self, answer: Any) -> Any:
        wrong = [  # each mistake as a function of the inputs, for Exercise._compare
            Mistake(m.why, lambda X, layer, cls=m.wrong: _run(cls, X, layer)) for m in self.mistakes
        ]
        compare = replace(self, mistakes=wrong)
        for trial in range(self.trials):
            X, layer = self.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
            try:
                got = _run(answer, X, layer)
            except NotImplementedError:
                return self._feedback(
                    "not attempted", "replace `raise NotImplementedError` with your code."
                )
            except _Verdict as verdict:
                return self._feedback("incorrect", f"{verdict} {_where(X, layer)}")
            except Exception as err:  # the learner's bug: report it, never crash the notebook
                frames = [
                    f
                    for f in traceback.extract_tb(err.__traceback__)
                    if "/torch/" not in f.filename
                ]
                where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
                return self._feedback(
                    "error",
                    f"your layer raised {type(err).__name__}: {err}{where} {_where(X, layer)}",
                )
            with torch.no_grad():
                expected = layer(X)
            verdict = Exercise._compare(compare, got, expected, (X, layer))
            if verdict is not None:
                return self._feedback("incorrect", f"{verdict} {_where(X, layer)}")
        return self._feedback(
            "correct",
            f"matches the package's SelfAttention, its weights loaded into yours, on {self.trials} "
            "random batches.",
        )


def _register(ex: Exercise) -> None:
    if ex.name in _REGISTRY:
        raise ValueError(f"exercise {ex.name!r} is defined twice")
    _REGISTRY[ex.name] = ex


_register(
    LayerExercise(
        name="multihead.layer",
        prompt=(
            "Write the class MultiHeadSelfAttention(D, H), an nn.Module: four maps self.W_q, "
            "self.W_k, self.W_v, self.W_o, each nn.Linear(D, D); forward(X) takes X (B, N, D), "
            "splits Q = W_q(X), K, V into H heads of width d_k = D / H (head h: features "
            "h*d_k:(h+1)*d_k), computes head_h = softmax_row(Q_h K_h^T / sqrt(d_k)) V_h, and returns "
            "W_o([head_1, ..., head_H]) of shape (B, N, D)."
        ),
        solution=MultiHeadSelfAttention,
        make_inputs=_layer_inputs,
        mistakes=LAYER_MISTAKES,
    )
)


# ---------------------------------------------------------------------------------------------------
# 5. Turner's output maps U_o,h (his V_h) from the value and output maps (Turner fn. 13; exercise 5 of
# the lecture notes on Bishop & Bishop). The answer is called U_o, not V: V is the values in the course.

_U_O_SIZES = ((4, 2), (6, 3), (8, 4))  # (D, H) per trial


def _U_o_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, int]:
    D, H = _U_O_SIZES[trial % 3]
    return randn(gen, D, D), randn(gen, D, D), H


def _blocks(D: int, H: int) -> list[slice]:
    d_v = D // H
    return [slice(h * d_v, (h + 1) * d_v) for h in range(H)]  # head h's contiguous block


def _U_o_full_product(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    return (W_v @ W_o).T.expand(H, *W_v.shape)  # the same full-rank matrix for every head


def _U_o_from_slices(W_v: Tensor, W_o: Tensor, H: int, slices) -> Tensor:
    return torch.stack([(W_v[:, s] @ W_o[s, :]).T for s in slices])


@exercise(
    name="multihead.turner_U_o",
    prompt=(
        "Given the value map W_v (D, D), the output map W_o (D, D) and H heads (d_v = D / H), return "
        "Turner's output maps U_o of shape (H, D, D) with U_o[h] = (W_v^(h) W_o^(h))^T, where "
        "W_v^(h) is columns h*d_v:(h+1)*d_v of W_v (D x d_v) and W_o^(h) is rows h*d_v:(h+1)*d_v "
        "of W_o (d_v x D), head h counted from 0."
    ),
    make_inputs=_U_o_inputs,
    mistakes=[
        Mistake(
            "the transpose is missing: W_v^(h) W_o^(h) acts on rows (X W_v^(h) W_o^(h)); Turner's map "
            "U_o,h acts on columns (U_o,h X^T), so U_o,h = (W_v^(h) W_o^(h))^T.",
            lambda W_v, W_o, H: _U_o_from_slices(W_v, W_o, H, _blocks(W_v.shape[0], H)).mT,
        ),
        Mistake(
            "you sliced columns of W_o (and transposed them to make the product fit); head h owns the "
            "ROWS h*d_v:(h+1)*d_v of W_o, the rows that multiply its block of the concatenation.",
            lambda W_v, W_o, H: _U_o_from_slices(W_v, W_o.T, H, _blocks(W_v.shape[0], H)),
        ),
        Mistake(
            "the slices are interleaved (every H-th column/row, as after a reshape to (D, d_v, H)); "
            "head h owns the contiguous block h*d_v:(h+1)*d_v.",
            lambda W_v, W_o, H: _U_o_from_slices(
                W_v, W_o, H, [slice(h, None, H) for h in range(H)]
            ),
        ),
        Mistake(
            "every head got the full product (W_v W_o)^T; U_o,h uses only head h's d_v columns of W_v "
            "and d_v rows of W_o (so rank U_o,h <= d_v, and the U_o,h sum to (W_v W_o)^T).",
            _U_o_full_product,
        ),
    ],
)
def turner_U_o(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    D = W_v.shape[0]
    d_v = D // H
    U_o = []
    for h in range(H):
        block = slice(h * d_v, (h + 1) * d_v)  # head h's d_v features
        U_o.append((W_v[:, block] @ W_o[block, :]).T)  # (D, d_v) @ (d_v, D) -> (D, D), rank <= d_v
    return torch.stack(U_o)  # (H, D, D)


# ---------------------------------------------------------------------------------------------------
# 6. Parameter counts of the two forms

_COUNT_SIZES = ((64, 8, True), (12, 3, False), (128, 4, True))  # (D, H, bias) per trial


def _counts(concat: int, turner: int) -> Tensor:
    return torch.tensor([concat, turner], dtype=torch.float64)


@exercise(
    name="multihead.param_count",
    prompt=(
        "Return the pair (n_params_concat, n_params_turner) of learnable parameter counts for width "
        "D and H heads with d_k = D / H: n_params_concat for the concat form (W_q, W_k, W_v, W_o, "
        "plus one bias vector per projection when bias is True), as in "
        "tc.multihead.SelfAttention(D, H, bias=bias); n_params_turner for Turner's form (U_q,h and "
        "U_k,h of shape d_k x D and U_o,h (his V_h) of shape D x D for each head; no biases)."
    ),
    make_inputs=lambda gen, trial: _COUNT_SIZES[trial % 3],
    mistakes=[
        Mistake(
            "n_params_concat misses the biases: with bias=True each of the four projections has a "
            "bias vector of length D (4D in all).",
            lambda D, H, bias: _counts(4 * D * D, H * (2 * (D // H) * D + D * D)),
        ),
        Mistake(
            "n_params_concat misses W_o: the output map adds D x D weights (and D biases).",
            lambda D, H, bias: _counts(3 * D * D + 3 * D * bias, H * (2 * (D // H) * D + D * D)),
        ),
        Mistake(
            "n_params_concat gives every head full D x D query, key and value maps; with "
            "d_k = D / H the H heads together fill one D x D matrix each for W_q, W_k and W_v.",
            lambda D, H, bias: _counts(
                3 * H * D * D + D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D)
            ),
        ),
        Mistake(
            "n_params_turner counts U_o,h as low rank (2 d_k D per head): Turner's U_o,h are full D x D "
            "matrices, H D^2 in all.",
            lambda D, H, bias: _counts(4 * D * D + 4 * D * bias, 4 * D * D),
        ),
        Mistake(
            "n_params_turner uses D x D query and key maps; Turner's U_q,h and U_k,h are d_k x D "
            "with d_k = D / H.",
            lambda D, H, bias: _counts(4 * D * D + 4 * D * bias, 3 * H * D * D),
        ),
        Mistake(
            "n_params_turner has biases added; Turner's form (his eq. 4-6) has none.",
            lambda D, H, bias: _counts(
                4 * D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D) + 4 * D * bias
            ),
        ),
    ],
)
def param_count(D: int, H: int, bias: bool) -> Tensor:
    d_k = D // H
    n_params_concat = 4 * D * D + (4 * D if bias else 0)  # W_q, W_k, W_v, W_o (D x D), biases
    n_params_turner = H * (2 * d_k * D + D * D)  # per head: U_q,h, U_k,h (d_k x D), U_o,h (D x D)
    return torch.tensor([n_params_concat, n_params_turner], dtype=torch.float64)
