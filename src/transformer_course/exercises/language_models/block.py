"""Part 3 of lab 7: the pre-norm block, ``Z = X + attn(LN1(X))``, then ``Z + MLP(LN2(Z))``. The
reference solution is ``scratch/gpt.py``'s :class:`Block`; the wrong variants below each change one
thing (or swap in a wrong attention layer of part 2)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...scratch.gpt import Block
from .. import Mistake
from .attention import ATTENTION_MISTAKES, _describe_vectors, _token_vectors_cases
from .checking import (
    CapstoneExercise,
    Output,
    _build,
    _close,
    _diagnose,
    _part,
    _register,
    _tensor,
    _variant,
    lab_state_dict,
    package_gpt,
)


class _Block(Block):
    """Wrong blocks: one attribute per mistake (``attention`` swaps in a wrong attention layer)."""

    arrangement = "pre"  # or post, no_attn_residual, no_mlp_residual, one_norm, normed_residual
    activation = "gelu"  # or "relu", "tanh" (GELU's tanh approximation)
    attention: type | None = None

    def __init__(self, config):
        super().__init__(config)
        if self.attention is not None:
            self.attn.__class__ = self.attention  # a subclass with another forward: same parameters

    def forward(self, X):
        act = {"gelu": nn.GELU(), "relu": nn.ReLU(), "tanh": nn.GELU(approximate="tanh")}
        act = act[self.activation]

        def mlp(h):
            return self.mlp[2](act(self.mlp[0](h)))

        a = self.arrangement
        if a == "post":
            Z = self.norm1(X + self.attn(X))
            return self.norm2(Z + mlp(Z))
        h = self.norm1(X)
        Z = {"no_attn_residual": 0, "normed_residual": h}.get(a, X) + self.attn(h)
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
    "your MLP uses ReLU; the course's GPT uses GELU in its exact form, nn.GELU() (GPT-2 itself used "
    "GELU's tanh approximation, nn.GELU(approximate='tanh'), close to the exact form but not equal)."
)
WHY_TANH_GELU = (
    "your MLP uses GELU's tanh approximation, nn.GELU(approximate='tanh'), as GPT-2 did; the course's "
    "GPT uses the exact form, PyTorch's default nn.GELU(), and the checker compares with it."
)
BLOCK_ONLY_MISTAKES = [
    Mistake(WHY_POST_NORM, _variant(_Block, "_PostNorm", arrangement="post")),
    Mistake(WHY_NO_ATTN_RESIDUAL, _variant(_Block, "_NoAttnRes", arrangement="no_attn_residual")),
    Mistake(WHY_NO_MLP_RESIDUAL, _variant(_Block, "_NoMlpRes", arrangement="no_mlp_residual")),
    Mistake(WHY_NORMED_RESIDUAL, _variant(_Block, "_NormedRes", arrangement="normed_residual")),
    Mistake(WHY_ONE_NORM, _variant(_Block, "_OneNorm", arrangement="one_norm")),
    Mistake(WHY_RELU, _variant(_Block, "_Relu", activation="relu")),
    Mistake(WHY_TANH_GELU, _variant(_Block, "_TanhGelu", activation="tanh")),
]
BLOCK_MISTAKES = BLOCK_ONLY_MISTAKES + [
    Mistake(m.why, _variant(_Block, "_BlockWith" + m.wrong.__name__, attention=m.wrong), m.fails_by)
    for m in ATTENTION_MISTAKES
]


def _observe_block(answer: Any, case: tuple) -> Output:
    config, X = case
    block = _build(answer, config, _part(lab_state_dict(package_gpt(config)), "blocks.0."), "Block")
    with torch.no_grad():
        return {"block(X)": _tensor(block(X), "Block.forward")}


def _expected_block(case: tuple) -> Output:
    config, X = case
    with torch.no_grad():
        return {"block(X)": package_gpt(config).stack.blocks[0](X)}


def _locate_block(block: nn.Module, theirs: nn.Module, X, config, prefix: str) -> str:
    """Where the learner's block ``block`` departs from the package's ``theirs`` on the input ``X``."""
    state = _part(lab_state_dict(package_gpt(config)), prefix)
    h = theirs.norm1(X)
    mine = _tensor(block.attn(h), "attn")
    if not _close(mine, theirs.attn(h)):
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
            "nn.GELU(), nn.Linear(4D, D)); forward(X) returns Z + MLP(LN2(Z)) with "
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
        registered_by=__name__,
    )
)
