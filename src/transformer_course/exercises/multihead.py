"""Exercises of the *Multi-head self-attention* lab: splitting and merging heads, multi-head
attention from its weights, Turner's low-rank ``V_h``, and the parameter count of both forms.

Chapter: *Multi-head self-attention* (Turner 2023 eq. 4-6 and footnotes 11-13; Bishop & Bishop 2024
sec. 2.11, Algorithm 2 and exercise 5; MIT 6.390 sec. 9.4.2). Rows are tokens; head ``h`` owns the
contiguous feature block ``h*d_k : (h+1)*d_k`` (columns of ``W_q, W_k, W_v``, rows of ``W_o``), as in
:mod:`transformer_course.multihead`. Inputs are float64 so the checkers can use tight tolerances.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from . import Mistake, exercise, randn

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
# 4. Turner's V_h from the value and output maps (Turner fn. 13; Bishop exercise 5)

_V_SIZES = ((4, 2), (6, 3), (8, 4))  # (D, H) per trial


def _V_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, int]:
    D, H = _V_SIZES[trial % 3]
    return randn(gen, D, D), randn(gen, D, D), H


def _blocks(D: int, H: int) -> list[slice]:
    K = D // H
    return [slice(h * K, (h + 1) * K) for h in range(H)]  # head h's contiguous block


def _V_full_product(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    return (W_v @ W_o).T.expand(H, *W_v.shape)  # the same full-rank matrix for every head


def _V_from_slices(W_v: Tensor, W_o: Tensor, H: int, slices) -> Tensor:
    return torch.stack([(W_v[:, s] @ W_o[s, :]).T for s in slices])


@exercise(
    name="multihead.turner_V",
    prompt=(
        "Given the value map W_v (D, D), the output map W_o (D, D) and H heads (K = D / H), return "
        "Turner's output maps V of shape (H, D, D) with V[h] = (W_v^(h) W_o^(h))^T, where W_v^(h) "
        "is columns h*K:(h+1)*K of W_v (D x K) and W_o^(h) is rows h*K:(h+1)*K of W_o (K x D)."
    ),
    make_inputs=_V_inputs,
    mistakes=[
        Mistake(
            "the transpose is missing: W_v^(h) W_o^(h) acts on rows (X W_v^(h) W_o^(h)); Turner's V_h "
            "acts on columns (V_h X^T), so V_h = (W_v^(h) W_o^(h))^T.",
            lambda W_v, W_o, H: _V_from_slices(W_v, W_o, H, _blocks(W_v.shape[0], H)).mT,
        ),
        Mistake(
            "you sliced columns of W_o (and transposed them to make the product fit); head h owns the "
            "ROWS h*K:(h+1)*K of W_o, the rows that multiply its block of the concatenation.",
            lambda W_v, W_o, H: _V_from_slices(W_v, W_o.T, H, _blocks(W_v.shape[0], H)),
        ),
        Mistake(
            "the slices are interleaved (every H-th column/row, as after a reshape to (D, K, H)); head "
            "h owns the contiguous block h*K:(h+1)*K.",
            lambda W_v, W_o, H: _V_from_slices(W_v, W_o, H, [slice(h, None, H) for h in range(H)]),
        ),
        Mistake(
            "every head got the full product (W_v W_o)^T; V_h uses only head h's K columns of W_v and "
            "K rows of W_o (so rank V_h <= K, and the V_h sum to (W_v W_o)^T).",
            _V_full_product,
        ),
    ],
)
def turner_V(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    D = W_v.shape[0]
    K = D // H
    V = []
    for h in range(H):
        block = slice(h * K, (h + 1) * K)  # head h's K features
        V.append((W_v[:, block] @ W_o[block, :]).T)  # (D, K) @ (K, D) -> (D, D), rank <= K
    return torch.stack(V)  # (H, D, D)


# ---------------------------------------------------------------------------------------------------
# 5. Parameter counts of the two forms

_COUNT_SIZES = ((64, 8, True), (12, 3, False), (128, 4, True))  # (D, H, bias) per trial


def _counts(concat: int, turner: int) -> Tensor:
    return torch.tensor([concat, turner], dtype=torch.float64)


@exercise(
    name="multihead.param_count",
    prompt=(
        "Return the pair (P_concat, P_turner) of learnable parameter counts for width D and H heads "
        "with K = D / H: P_concat for the concat form (W_q, W_k, W_v, W_o, plus one bias vector per "
        "projection when bias is True), as in tc.multihead.SelfAttention(D, H, bias=bias); "
        "P_turner for Turner's form (U_q,h and U_k,h of shape K x D and V_h of shape D x D for each "
        "head; no biases)."
    ),
    make_inputs=lambda gen, trial: _COUNT_SIZES[trial % 3],
    mistakes=[
        Mistake(
            "P_concat misses the biases: with bias=True each of the four projections has a bias "
            "vector of length D (4D in all).",
            lambda D, H, bias: _counts(4 * D * D, H * (2 * (D // H) * D + D * D)),
        ),
        Mistake(
            "P_concat misses W_o: the output map adds D x D weights (and D biases).",
            lambda D, H, bias: _counts(3 * D * D + 3 * D * bias, H * (2 * (D // H) * D + D * D)),
        ),
        Mistake(
            "P_concat gives every head full D x D query, key and value maps; with d_k = D / H the H "
            "heads together fill one D x D matrix each for W_q, W_k and W_v.",
            lambda D, H, bias: _counts(
                3 * H * D * D + D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D)
            ),
        ),
        Mistake(
            "P_turner counts V_h as low rank (2KD per head): Turner's V_h are full D x D matrices, "
            "H D^2 in all.",
            lambda D, H, bias: _counts(4 * D * D + 4 * D * bias, 4 * D * D),
        ),
        Mistake(
            "P_turner uses D x D query and key maps; Turner's U_q,h and U_k,h are K x D with "
            "K = D / H.",
            lambda D, H, bias: _counts(4 * D * D + 4 * D * bias, 3 * H * D * D),
        ),
        Mistake(
            "P_turner has biases added; Turner's form (his eq. 4-6) has none.",
            lambda D, H, bias: _counts(
                4 * D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D) + 4 * D * bias
            ),
        ),
    ],
)
def param_count(D: int, H: int, bias: bool) -> Tensor:
    K = D // H
    P_concat = 4 * D * D + (4 * D if bias else 0)  # W_q, W_k, W_v, W_o (D x D) and their biases
    P_turner = H * (2 * K * D + D * D)  # per head: U_q,h, U_k,h (K x D) and V_h (D x D)
    return torch.tensor([P_concat, P_turner], dtype=torch.float64)
