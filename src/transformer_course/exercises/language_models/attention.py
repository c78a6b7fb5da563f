"""Part 2 of lab 7: causal multi-head self-attention with four maps ``W_q, W_k, W_v, W_o``. The
reference solution is ``scratch/gpt.py``'s :class:`CausalSelfAttention`; the wrong variants below each
change one thing. When no variant explains a difference, the checker runs the learner's layer with a
single head: if it matches there, the split into heads or their merge is what is wrong."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ...scratch.gpt import CausalSelfAttention
from .. import Mistake, randn
from .checking import (
    _CONFIGS,
    CapstoneExercise,
    Output,
    _build,
    _close,
    _part,
    _register,
    _sizes_of,
    _tensor,
    _variant,
    lab_state_dict,
    package_gpt,
)


class _Attention(CausalSelfAttention):
    """Wrong attention layers: one attribute per mistake."""

    mask = "causal"  # "none", "past" (hides the past), "diagonal" (hides the diagonal too)
    scale = "d_k"  # "none", "D", "d_k_unrooted" (d_k itself, not its square root)
    softmax_dim = -1
    split = "heads"  # "straight" (reshape to (B, H, N, d_k)), "no_transpose", "d_k_first"
    merge_transposed = projects_out = True
    masks_after_softmax = scores_transposed = False

    def _heads(self, T, B, N):
        if self.split == "straight":
            return T.reshape(B, self.H, N, self.d_k)  # features of different tokens in one row
        if self.split == "no_transpose":
            return T.view(B, N, self.H, self.d_k)  # the heads never move in front of the positions
        if self.split == "d_k_first":
            return T.view(B, N, self.d_k, self.H).permute(0, 3, 1, 2)  # head h: every H-th feature
        return T.view(B, N, self.H, self.d_k).transpose(1, 2)

    def forward(self, X):
        B, N, D = X.shape
        Q, K, V = (self._heads(W(X), B, N) for W in (self.W_q, self.W_k, self.W_v))
        scale = {
            "d_k": math.sqrt(self.d_k),
            "D": math.sqrt(D),
            "none": 1.0,
            "d_k_unrooted": self.d_k,
        }[self.scale]
        S = (K @ Q.transpose(-2, -1) if self.scores_transposed else Q @ K.transpose(-2, -1)) / scale
        ones = torch.ones(N, N, dtype=torch.bool, device=X.device)
        hidden = {
            "causal": ones.triu(1),
            "past": ones.tril(-1),
            "diagonal": ones.triu(0),
            "none": ~ones,
        }[self.mask]
        if self.masks_after_softmax:
            A = torch.softmax(S, dim=self.softmax_dim) * ~hidden
        else:
            A = torch.softmax(S.masked_fill(hidden, float("-inf")), dim=self.softmax_dim)
        Y = A @ V  # (B, H, N, d_k), or (B, N, H, d_k) when the heads never moved
        if self.merge_transposed and self.split != "no_transpose":
            Y = Y.transpose(1, 2)
        Y = Y.reshape(B, N, D)
        return self.W_o(Y) if self.projects_out else Y


WHY_NO_MASK = (
    "your attention has no causal mask: every token sees the tokens after it, which do not exist yet "
    "when the model generates. Set the scores of keys m > n to -inf before the softmax."
)
WHY_MASK_HIDES_PAST = (
    "your mask hides the past and shows the future: query n may see the keys m <= n (the lower "
    "triangle), so mask the scores where torch.ones(N, N).triu(1) is True."
)
WHY_MASK_HIDES_DIAGONAL = (
    "your mask also hides the diagonal (key m = n), so the first query has no key left: its scores "
    "are -inf everywhere, its softmax is 0/0 (NaN), and the NaN spreads. A token may attend to itself: "
    "mask only m > n, torch.ones(N, N).triu(diagonal=1)."
)
WHY_NO_SCALE = (
    "the scores are not scaled: divide Q K^T by sqrt(d_k) before the softmax, with d_k = D / H the "
    "width of one head."
)
WHY_SCALE_D = (
    "you scaled the scores by 1/sqrt(D); the scale is 1/sqrt(d_k), with d_k = D / H the width of one "
    "head."
)
WHY_SCALE_NO_ROOT = (
    "you divided the scores by d_k; the scale is 1/sqrt(d_k), the square root of the width of one "
    "head (math.sqrt(d_k)), which keeps the scores' spread near one."
)
WHY_SOFTMAX_AXIS = (
    "the softmax ran over the queries (dim=-2); each query's weights over the keys must sum to one: "
    "softmax over dim=-1."
)
WHY_SCORES_TRANSPOSED = (
    "your scores are transposed, K Q^T: row n must hold query n's dot products with every key, "
    "S = Q @ K.transpose(-2, -1), so that S[n, m] = q_n . k_m."
)
WHY_SPLIT_STRAIGHT = (
    "the heads are split wrongly: you reshaped (B, N, D) straight to (B, H, N, d_k), which mixes "
    "features of different tokens into one row; view it as (B, N, H, d_k), then transpose(1, 2) to "
    "(B, H, N, d_k)."
)
WHY_SPLIT_NO_TRANSPOSE = (
    "the heads are split without the transpose: after .view(B, N, H, d_k) the positions still come "
    "before the heads, so Q @ K^T pairs the heads of one token (scores (B, N, H, H)) and the (N, N) "
    "mask cannot apply; .transpose(1, 2) to (B, H, N, d_k) first, so each head's queries meet its keys."
)
WHY_SPLIT_D_K_FIRST = (
    "the features are split into heads in the wrong order: .view(B, N, d_k, H) gives head h every H-th "
    "feature; view as (B, N, H, d_k) so that head h takes the contiguous features h*d_k .. "
    "(h+1)*d_k - 1, as W_o expects them back."
)
WHY_MERGE_HEADS = (
    "the heads are merged wrongly: transpose (B, H, N, d_k) back to (B, N, H, d_k) before reshaping "
    "to (B, N, D), so that each token gets its own heads' outputs."
)
WHY_NO_OUT_PROJ = "you left out the output projection: the concatenated heads go through W_o."
WHY_MASK_AFTER_SOFTMAX = (
    "you zeroed the future's weights after the softmax, so the rows no longer sum to one; set the "
    "future's scores to -inf before the softmax."
)
WHY_HEADS = (
    "with one head (H = 1) your layer matches the package's, with H = {H} it does not: the split into "
    "heads or their merge is wrong. Split each of Q, K, V with .view(B, N, H, d_k).transpose(1, 2) to "
    "(B, H, N, d_k) (head h takes the features h*d_k .. (h+1)*d_k - 1); merge with "
    ".transpose(1, 2).reshape(B, N, D)."
)
ATTENTION_MISTAKES = [
    Mistake(WHY_NO_MASK, _variant(_Attention, "_NoMask", mask="none")),
    Mistake(WHY_MASK_HIDES_PAST, _variant(_Attention, "_HidesPast", mask="past")),
    Mistake(
        WHY_MASK_HIDES_DIAGONAL, _variant(_Attention, "_HidesDiagonal", mask="diagonal"), "nan"
    ),
    Mistake(WHY_NO_SCALE, _variant(_Attention, "_NoScale", scale="none")),
    Mistake(WHY_SCALE_D, _variant(_Attention, "_ScaleD", scale="D")),
    Mistake(WHY_SCALE_NO_ROOT, _variant(_Attention, "_ScaleDk", scale="d_k_unrooted")),
    Mistake(WHY_SOFTMAX_AXIS, _variant(_Attention, "_QueryAxis", softmax_dim=-2)),
    Mistake(WHY_SCORES_TRANSPOSED, _variant(_Attention, "_KQ", scores_transposed=True)),
    Mistake(WHY_SPLIT_STRAIGHT, _variant(_Attention, "_StraightSplit", split="straight")),
    Mistake(
        WHY_SPLIT_NO_TRANSPOSE, _variant(_Attention, "_NoTranspose", split="no_transpose"), "raises"
    ),
    Mistake(WHY_SPLIT_D_K_FIRST, _variant(_Attention, "_DkFirst", split="d_k_first")),
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


def _locate_attention(answer: Any, case: tuple) -> str | None:
    """With one head the split and the merge do nothing: a layer that matches there splits or merges
    its heads wrongly."""
    config, X = case
    one = dataclasses.replace(config, H=1)
    got = _observe_attention(answer, (one, X))["attn(X)"]
    if _close(got, _expected_attention((one, X))["attn(X)"]):
        return WHY_HEADS.format(H=config.H)
    return None


def _describe_vectors(case: tuple) -> str:
    return f"case: {_sizes_of(case[0])}; X {tuple(case[1].shape)}"


_register(
    CapstoneExercise(
        name="language_models.attention",
        prompt=(
            "Write the class CausalSelfAttention(config): W_q, W_k, W_v and W_o, each "
            "nn.Linear(D, D); forward(X (B, N, D)) splits the queries, keys and values into H heads "
            "of width d_k = D / H, takes softmax(Q K^T / sqrt(d_k)) over the keys with the future "
            "masked, and returns W_o applied to the concatenated heads, (B, N, D)."
        ),
        solution=CausalSelfAttention,
        mistakes=ATTENTION_MISTAKES,
        cases=_token_vectors_cases,
        observe=_observe_attention,
        expected=_expected_attention,
        locate=_locate_attention,
        describe=_describe_vectors,
        atol=1e-6,
        rtol=1e-6,
        passed="matches the package's attention",
        registered_by=__name__,
    )
)
