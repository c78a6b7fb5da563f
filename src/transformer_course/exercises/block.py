"""Exercises of the *Transformer block* lab: LayerNorm from scratch, a pre-norm block from its parts,
the flattened (Kronecker) form of a token-wise linear map, and the parameter count of a block.

Chapter: *The transformer block* (Turner 2023 sec. 2.2-2.3; the lecture notes on Bishop & Bishop 2024,
``bishop2024notes``, sec. 2.12-2.13, Algorithm 3 and exercise 6 in their own numbering; Dramko 2025
sec. 4). Every input is float64 so the checkers can use tight tolerances; the sub-modules handed to the
block exercise have random (not default) weights so that each wrong arrangement gives different
numbers.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..block import MLP, LayerNorm
from ..multihead import SelfAttention
from . import Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# 1. LayerNorm of every token, from scratch


def _layer_norm_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, float]:
    B, N, D = ((2, 3, 5), (3, 4, 6), (2, 6, 8))[trial % 3]
    eps = (0.1, 1e-3, 0.01)[trial % 3]
    scale = torch.exp(
        2.0 * randn(gen, B, N, 1)
    )  # (B, N, 1): some tokens vary little, so eps matters
    X = 1.5 + scale * randn(gen, B, N, D)  # (B, N, D), not centred
    return X, 1.0 + 0.5 * randn(gen, D), 0.5 * randn(gen, D), eps


def _ln(X: Tensor, gamma: Tensor, beta: Tensor, eps: float, dim=-1, unbiased=False, inside=True):
    mu = X.mean(dim=dim, keepdim=True)
    var = X.var(dim=dim, keepdim=True, unbiased=unbiased)
    denom = torch.sqrt(var + eps) if inside else torch.sqrt(var) + eps
    return gamma * (X - mu) / denom + beta


@exercise(
    name="block.layer_norm",
    prompt=(
        "X is (B, N, D), gamma and beta are (D,), eps a float. Return LayerNorm(X) of shape (B, N, D): "
        "for every token (every b, n) subtract the mean of its D features, divide by "
        "sqrt(var + eps) with the biased variance (divide by D), then multiply by gamma and add beta."
    ),
    make_inputs=_layer_norm_inputs,
    mistakes=[
        Mistake(
            "you normalised each feature over the tokens of a sequence (dim=-2); LayerNorm normalises "
            "each token over its D features (dim=-1).",
            lambda X, g, b, eps: _ln(X, g, b, eps, dim=-2),
        ),
        Mistake(
            "you normalised each feature over the batch and the tokens (dims 0 and 1): that is "
            "BatchNorm's axis. LayerNorm uses each token's own D features (dim=-1).",
            lambda X, g, b, eps: _ln(X, g, b, eps, dim=(0, 1)),
        ),
        Mistake(
            "you normalised each sequence over its tokens and features together (dims -2 and -1), "
            "the way some convolutional networks' 'LayerNorm' averages over positions and channels "
            "(Turner's fig. 6). A transformer's LayerNorm uses each token's own D features (dim=-1).",
            lambda X, g, b, eps: _ln(X, g, b, eps, dim=(-2, -1)),
        ),
        Mistake(
            "you used the unbiased variance (divide by D - 1); LayerNorm divides by D "
            "(X.var(dim=-1, unbiased=False), as torch.nn.LayerNorm does).",
            lambda X, g, b, eps: _ln(X, g, b, eps, unbiased=True),
        ),
        Mistake(
            "eps is outside the square root: you divided by sigma + eps (Dramko's form); "
            "torch.nn.LayerNorm divides by sqrt(var + eps).",
            lambda X, g, b, eps: _ln(X, g, b, eps, inside=False),
        ),
        Mistake(
            "eps is missing: divide by sqrt(var + eps), not sqrt(var); it matters for tokens whose "
            "features vary little.",
            lambda X, g, b, eps: _ln(X, g, b, 0.0),
        ),
        Mistake(
            "gamma and beta are swapped: gamma multiplies the normalised value and beta is added.",
            lambda X, g, b, eps: _ln(X, b, g, eps),
        ),
        Mistake(
            "the mean was not subtracted: LayerNorm centres each token before dividing by its "
            "standard deviation.",
            lambda X, g, b, eps: (
                g * X / torch.sqrt(X.var(dim=-1, keepdim=True, unbiased=False) + eps) + b
            ),
        ),
    ],
)
def layer_norm(X: Tensor, gamma: Tensor, beta: Tensor, eps: float) -> Tensor:
    mu = X.mean(dim=-1, keepdim=True)  # (B, N, 1): one mean per token
    var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)  # (B, N, 1): biased, divide by D
    return gamma * (X - mu) / torch.sqrt(var + eps) + beta  # (B, N, D)


# ---------------------------------------------------------------------------------------------------
# 2. A pre-norm block from given sub-modules


class _Sublayer:
    """A module wrapped for the learner: callable, and printed by name in the checker's messages."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name, self.module = name, module

    def __call__(self, X: Tensor) -> Tensor:
        return self.module(X)

    def __repr__(self) -> str:
        return self.name


def _randomise(module: nn.Module, gen: torch.Generator, std: float) -> nn.Module:
    module = module.double().requires_grad_(False)
    for p in module.parameters():
        p.copy_(std * randn(gen, *p.shape))
    return module


def _block_inputs(gen: torch.Generator, trial: int) -> tuple:
    B, N, D, H = ((2, 4, 6, 2), (1, 5, 8, 4), (3, 3, 4, 1))[trial % 3]
    attn = _randomise(SelfAttention(D, H), gen, 1.0 / math.sqrt(D))
    mlp = _randomise(MLP(D, 2 * D), gen, 1.0 / math.sqrt(D))
    norm1, norm2 = _randomise(LayerNorm(D), gen, 1.0), _randomise(LayerNorm(D), gen, 1.0)
    with torch.no_grad():
        norm1.weight.add_(1.0)  # gamma near one, beta near zero: a typical trained LayerNorm
        norm2.weight.add_(1.0)
        norm1.bias.mul_(0.3)
        norm2.bias.mul_(0.3)
    X = 0.5 + 3.0 * randn(gen, B, N, D)  # raw scale 3, not centred: LN(X) is far from X
    return (
        X,
        _Sublayer(f"attn (SelfAttention, D={D}, H={H})", attn),
        _Sublayer(f"mlp (MLP, D={D}, d_ff={2 * D})", mlp),
        _Sublayer(f"norm1 (LayerNorm({D}))", norm1),
        _Sublayer(f"norm2 (LayerNorm({D}))", norm2),
    )


def _seed_001_block(X, attn, mlp, norm1, norm2):
    X_bar = norm1(X)
    Y = X_bar + attn(X_bar)  # the residual starts from the normalised input
    return Y + mlp(norm2(Y))


@exercise(
    name="block.prenorm_block",
    prompt=(
        "X is (B, N, D); attn, mlp, norm1 and norm2 are callables mapping (B, N, D) to (B, N, D). "
        "Return the pre-norm block's output: Z = X + attn(norm1(X)), then Z + mlp(norm2(Z))."
    ),
    make_inputs=_block_inputs,
    mistakes=[
        Mistake(
            "this is the post-norm order (norm after the residual sum, as in Vaswani et al. and "
            "Algorithm 3 of the lecture notes on Bishop & Bishop): Z = norm1(X + attn(X)). "
            "Pre-norm normalises the sub-layer's input only: Z = X + attn(norm1(X)), then "
            "Z + mlp(norm2(Z)).",
            lambda X, attn, mlp, norm1, norm2: (lambda Z: norm2(Z + mlp(Z)))(norm1(X + attn(X))),
        ),
        Mistake(
            "the first residual starts from the normalised input, norm1(X) + attn(norm1(X)) (the slip "
            "in the Jupyter Book retelling of Turner): the identity path must carry the raw X, "
            "Z = X + attn(norm1(X)).",
            _seed_001_block,
        ),
        Mistake(
            "both residuals start from normalised inputs (norm(X) + sublayer(norm(X))): the identity "
            "path must carry the un-normalised stream, Z = X + attn(norm1(X)) and Z + mlp(norm2(Z)).",
            lambda X, attn, mlp, norm1, norm2: (lambda Zn: Zn + mlp(Zn))(
                norm2(norm1(X) + attn(norm1(X)))
            ),
        ),
        Mistake(
            "the MLP reads the block's input X instead of Z = X + attn(norm1(X)): that is the "
            "'parallel' block of GPT-J and PaLM, not the sequential pre-norm block.",
            lambda X, attn, mlp, norm1, norm2: X + attn(norm1(X)) + mlp(norm2(X)),
        ),
        Mistake(
            "norm1 and norm2 are swapped: norm1 belongs to the attention sub-layer, norm2 to the MLP.",
            lambda X, attn, mlp, norm1, norm2: (lambda Z: Z + mlp(norm1(Z)))(X + attn(norm2(X))),
        ),
        Mistake(
            "the residual connections are missing: add each sub-layer's output to its input stream, "
            "Z = X + attn(norm1(X)) and Z + mlp(norm2(Z)).",
            lambda X, attn, mlp, norm1, norm2: mlp(norm2(attn(norm1(X)))),
        ),
        Mistake(
            "you normalised the block's output as well: a pre-norm block returns Z + mlp(norm2(Z)) "
            "un-normalised (a stack applies one final LayerNorm after its last block).",
            lambda X, attn, mlp, norm1, norm2: (lambda Z: norm2(Z + mlp(norm2(Z))))(
                X + attn(norm1(X))
            ),
        ),
    ],
)
def prenorm_block(X: Tensor, attn, mlp, norm1, norm2) -> Tensor:
    Z = X + attn(norm1(X))  # (B, N, D): the identity path carries the raw X
    return Z + mlp(norm2(Z))  # (B, N, D)


# ---------------------------------------------------------------------------------------------------
# 3. A token-wise linear map as one (N D_out) x (N D_in) matrix acting on the flattened sequence


def _kron_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, int]:
    N, D_in, D_out = ((3, 2, 2), (2, 3, 4), (4, 3, 2))[trial % 3]
    return randn(gen, D_in, D_out), N


@exercise(
    name="block.flattened_linear",
    prompt=(
        "W is (D_in, D_out) and N an int. Return the (N*D_out, N*D_in) matrix W_flat such that "
        "W_flat @ X.reshape(-1) equals (X @ W).reshape(-1) for every X of shape (N, D_in) "
        "(reshape(-1) stacks the rows: token 1's features, then token 2's, ...)."
    ),
    make_inputs=_kron_inputs,
    mistakes=[
        Mistake(
            "the diagonal blocks must be W^T, not W: row n of X W is W^T x_n as a column vector, so "
            "W_flat = kron(I_N, W.T).",
            lambda W, N: torch.kron(torch.eye(N, dtype=W.dtype), W),
        ),
        Mistake(
            "the factors are swapped: kron(W.T, I_N) acts on the columns-first flattening "
            "X.T.reshape(-1); for rows-first X.reshape(-1) the identity comes first, "
            "kron(I_N, W.T).",
            lambda W, N: torch.kron(W.T.contiguous(), torch.eye(N, dtype=W.dtype)),
        ),
        Mistake(
            "every block holds W^T, so each output token would sum over all input tokens; the map acts "
            "on each token alone, so the off-diagonal blocks are zero: kron(I_N, W.T).",
            lambda W, N: torch.kron(torch.ones(N, N, dtype=W.dtype), W.T.contiguous()),
        ),
    ],
)
def flattened_linear(W: Tensor, N: int) -> Tensor:
    I_N = torch.eye(N, dtype=W.dtype)  # (N, N): token n only sees token n
    # torch.kron fails on a transposed (non-contiguous) view (pytorch issue 54135): copy it first
    return torch.kron(I_N, W.T.contiguous())  # (N*D_out, N*D_in): N copies of W^T on the diagonal


# ---------------------------------------------------------------------------------------------------
# 4. Parameters of one block


def _count_inputs(gen: torch.Generator, trial: int) -> tuple[int, int, int]:
    return ((16, 4, 64), (12, 3, 20), (30, 5, 100))[trial % 3]


def _count(D, H, d_ff, biases=True, norms=2, per_head=False, W_o=True):
    qkv = 3 * D * D * (H if per_head else 1) + (3 * D * (H if per_head else 1) if biases else 0)
    out = (D * D + (D if biases else 0)) if W_o else 0
    mlp = 2 * D * d_ff + ((d_ff + D) if biases else 0)
    return torch.tensor(float(qkv + out + mlp + norms * 2 * D), dtype=torch.float64)


@exercise(
    name="block.param_count",
    prompt=(
        "Return the number of learnable parameters of one pre-norm block (as PreNormBlock(D, H, d_ff) "
        "or nn.TransformerEncoderLayer) with model width D, H heads and MLP width d_ff: multi-head "
        "attention (W_q, W_k, W_v, W_o with biases), the MLP (two linear maps with biases) and two "
        "LayerNorms (gamma and beta each)."
    ),
    make_inputs=_count_inputs,
    mistakes=[
        Mistake(
            "the biases of the linear maps are missing: 3D (for q, k, v) + D (output) + d_ff + D (MLP).",
            lambda D, H, d_ff: _count(D, H, d_ff, biases=False),
        ),
        Mistake(
            "the LayerNorm parameters are missing: each of the two LayerNorms has gamma and beta, "
            "2D each.",
            lambda D, H, d_ff: _count(D, H, d_ff, norms=0),
        ),
        Mistake(
            "you counted one LayerNorm; a block has two (one per sub-layer), 2D parameters each.",
            lambda D, H, d_ff: _count(D, H, d_ff, norms=1),
        ),
        Mistake(
            "you gave every head its own D x D maps: each head's W_q, W_k, W_v are D x d_k with "
            "d_k = D/H, so all heads together hold 3 D x D matrices whatever H is.",
            lambda D, H, d_ff: _count(D, H, d_ff, per_head=True),
        ),
        Mistake(
            "the output map W_o (D x D, plus its bias D) is missing.",
            lambda D, H, d_ff: _count(D, H, d_ff, W_o=False),
        ),
    ],
)
def param_count(D: int, H: int, d_ff: int) -> Tensor:
    attention = 4 * D * D + 4 * D  # W_q, W_k, W_v, W_o and their biases; H does not matter
    mlp = D * d_ff + d_ff + d_ff * D + D  # W_1, b_1, W_2, b_2
    norms = 2 * 2 * D  # gamma and beta of two LayerNorms
    return torch.tensor(float(attention + mlp + norms), dtype=torch.float64)
