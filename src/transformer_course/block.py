"""The transformer block: token-wise MLP, LayerNorm, residuals, post-norm and pre-norm blocks, a stack.

Chapter: *The transformer block* (Turner 2023 sec. 2.2-2.3; the lecture notes on Bishop & Bishop 2024,
``bishop2024notes``, sec. 2.12-2.13 and Algorithm 3 in their own numbering; Dramko 2025 sec. 4).
Variants are small classes, not flags: :class:`PostNormBlock` is the original arrangement of Vaswani et
al. (2017) and ``nn.TransformerEncoderLayer(norm_first=False)``; :class:`PreNormBlock` is the
arrangement Xiong et al. (2020) analyse and GPT-2 uses (``norm_first=True``). Both load weights from
``torch.nn.TransformerEncoderLayer`` and are tested equal to it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .multihead import SelfAttention

if TYPE_CHECKING:
    from .kv_cache import KVCache

__all__ = [
    "ACTIVATIONS",
    "MLP",
    "LayerNorm",
    "PostNormBlock",
    "PreNormBlock",
    "TransformerStack",
    "gelu",
    "gelu_tanh",
    "layer_norm_reference",
]


def gelu(X: Tensor) -> Tensor:
    r"""GELU, entry by entry (Hendrycks & Gimpel 2016): the activation of the course's trained models.

    Implements: eq-block-gelu

    .. math:: \mathrm{GELU}(x) = \frac{x}{2}\Big(1 + \operatorname{erf}\frac{x}{\sqrt{2}}\Big)

    ``x`` times the probability that a standard normal variable is at most ``x``. The exact form
    (``F.gelu``'s default ``approximate="none"``, as in ``nn.TransformerEncoderLayer``), not the tanh
    approximation that some implementations use.
    """
    return F.gelu(X, approximate="none")


def gelu_tanh(X: Tensor) -> Tensor:
    r"""GELU in the tanh approximation of Hendrycks & Gimpel (2016, sec. 2), the activation of GPT-2
    (Hugging Face's ``activation_function="gelu_new"``), entry by entry:

    .. math:: \frac{x}{2}\Big(1 + \tanh\Big(\sqrt{2/\pi}\,\big(x + 0.044715\,x^3\big)\Big)\Big)

    It differs from :func:`gelu` by up to about 3e-4 (near ``|x| = 2``): small, but a model trained
    with one and run with the other computes another function.
    """
    return F.gelu(X, approximate="tanh")


ACTIVATIONS = {"relu": F.relu, "gelu": gelu, "gelu_tanh": gelu_tanh}  # the MLP's activation phi


def _activation(name: str):
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(
            f"unknown activation {name!r}; choose one of {sorted(ACTIVATIONS)}"
        ) from None


def layer_norm_reference(X: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
    r"""LayerNorm of every token (Ba et al. 2016; Turner's "TokenNorm"), as a formula.

    Implements: eq-block-layernorm

    .. math:: \mu_n = \frac1D\sum_d X_{nd},\quad \sigma^2_n = \frac1D\sum_d (X_{nd}-\mu_n)^2,\quad
              \mathrm{LN}(X)_{nd} = \gamma_d\,\frac{X_{nd}-\mu_n}{\sqrt{\sigma_n^2+\epsilon}} + \beta_d

    The variance is the biased one (divide by ``D``) and ``eps`` sits inside the square root, as in
    ``torch.nn.LayerNorm``. (Dramko 2025 divides by ``sigma + eps`` instead, a small numerical
    difference the book measures.)

    Args:
        X: ``(..., D)``; gamma, beta: ``(D,)``.
    """
    if gamma.shape != (X.shape[-1],) or beta.shape != (X.shape[-1],):
        raise ValueError(
            f"gamma {tuple(gamma.shape)} and beta {tuple(beta.shape)} must both be (D,) = "
            f"({X.shape[-1]},) for X of shape {tuple(X.shape)}"
        )
    mu = X.mean(dim=-1, keepdim=True)  # (..., 1)
    var = ((X - mu) ** 2).mean(dim=-1, keepdim=True)  # (..., 1), biased
    return gamma * (X - mu) / torch.sqrt(var + eps) + beta


class LayerNorm(nn.Module):
    """LayerNorm with learned ``gamma`` (``weight``) and ``beta`` (``bias``), both of shape ``(D,)``.

    Implements: eq-block-layernorm

    The forward pass calls the fused ``F.layer_norm`` (one kernel instead of nine); the equation itself
    is :func:`layer_norm_reference`, and ``tests/test_block.py`` proves the two equal.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma
        self.bias = nn.Parameter(torch.zeros(d_model))  # beta

    def forward(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"LayerNorm({self.weight.shape[0]}) got tokens of width {X.shape[-1]} "
                f"(X {tuple(X.shape)})"
            )
        return F.layer_norm(X, self.weight.shape, self.weight, self.bias, self.eps)


class MLP(nn.Module):
    r"""The token-wise MLP: the same two-layer network for every token.

    Implements: eq-block-mlp

    .. math:: \mathrm{MLP}(X) = \phi(X W_1 + \mathbf{1}_N\mathbf{b}_1^\top)\, W_2
              + \mathbf{1}_N\mathbf{b}_2^\top,\qquad
              W_1 \in \mathbb{R}^{D\times d_\text{ff}},\ W_2 \in \mathbb{R}^{d_\text{ff}\times D}

    (Turner 2023 sec. 2.2; the lecture notes on Bishop & Bishop 2024, sec. 2.12.2.) ``nn.Linear`` stores
    ``W^T``. Dropout, when a block trains with it, acts on the MLP's output before the residual sum (as
    in Vaswani et al. and GPT-2), not inside the MLP as ``nn.TransformerEncoderLayer`` also does; in
    evaluation mode the two are the same function.
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "relu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.act = _activation(activation)

    def forward(self, X: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(X)))  # (..., N, D) -> (..., N, d_ff) -> (..., N, D)


class _Block(nn.Module):
    """Parts shared by both arrangements; subclasses define only ``forward``.

    ``final_norm`` says whether a stack of these blocks needs a LayerNorm after the last one (a pre-norm
    residual stream is never normalised otherwise).
    """

    final_norm: ClassVar[bool]

    def __init__(
        self,
        d_model: int,
        H: int,
        d_ff: int | None = None,
        activation: str = "relu",
        dropout: float = 0.0,
        eps: float = 1e-5,
        causal: bool = False,
    ) -> None:
        super().__init__()
        self.attn = SelfAttention(d_model, H, causal=causal, dropout=dropout)
        self.mlp = MLP(d_model, d_ff or 4 * d_model, activation)
        self.norm1 = LayerNorm(d_model, eps)
        self.norm2 = LayerNorm(d_model, eps)
        self.drop1 = nn.Dropout(dropout)
        self.drop2 = nn.Dropout(dropout)

    def load_from_torch(self, layer: nn.TransformerEncoderLayer) -> _Block:
        """Copy the weights of a ``torch.nn.TransformerEncoderLayer`` with the same sizes."""
        self.attn.load_from_torch(layer.self_attn)
        pairs = [
            (self.mlp.fc1, layer.linear1),
            (self.mlp.fc2, layer.linear2),
            (self.norm1, layer.norm1),
            (self.norm2, layer.norm2),
        ]
        with torch.no_grad():
            for ours, theirs in pairs:
                if ours.weight.shape != theirs.weight.shape:
                    raise ValueError(
                        f"shape mismatch copying {type(theirs).__name__}: "
                        f"{tuple(theirs.weight.shape)} into {tuple(ours.weight.shape)}"
                    )
                ours.weight.copy_(theirs.weight)
                ours.bias.copy_(theirs.bias)
        return self


class PostNormBlock(_Block):
    r"""Post-norm block (Vaswani et al. 2017; eq. 20 and 22 and Algorithm 3 of the lecture notes on
    Bishop & Bishop):

    Implements: eq-block-postnorm

    .. math:: Z = \mathrm{LN}_1\big(X + \mathrm{MHSA}(X)\big),\qquad
              \mathrm{Block}(X) = \mathrm{LN}_2\big(Z + \mathrm{MLP}(Z)\big)

    ``Z`` is the residual stream between the two stages.

    Equals ``nn.TransformerEncoderLayer(norm_first=False, batch_first=True)`` with copied weights.
    """

    final_norm = False

    def forward(
        self, X: Tensor, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        Z = self.norm1(X + self.drop1(self.attn(X, mask, cache)))  # (B, N, D)
        return self.norm2(Z + self.drop2(self.mlp(Z)))  # (B, N, D)


class PreNormBlock(_Block):
    r"""Pre-norm block (Xiong et al. 2020; eq. 21 and 23 of the lecture notes on Bishop & Bishop):

    Implements: eq-block-prenorm

    .. math:: Z = X + \mathrm{MHSA}\big(\mathrm{LN}_1(X)\big),\qquad
              \mathrm{Block}(X) = Z + \mathrm{MLP}\big(\mathrm{LN}_2(Z)\big)

    ``Z`` is the residual stream between the two stages.

    Equals ``nn.TransformerEncoderLayer(norm_first=True, batch_first=True)`` with copied weights.
    """

    final_norm = True

    def forward(
        self, X: Tensor, mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        Z = X + self.drop1(self.attn(self.norm1(X), mask, cache))  # (B, N, D)
        return Z + self.drop2(self.mlp(self.norm2(Z)))  # (B, N, D)


class TransformerStack(nn.Module):
    r"""``L`` blocks applied in turn, :math:`X^{(\ell)} = \mathrm{Block}_\ell(X^{(\ell-1)})`, then a
    final LayerNorm when the blocks need one.

    Implements: eq-block-stack

    Pre-norm stacks end with a final LayerNorm (the residual stream is never normalised otherwise), as
    in GPT-2 and ``nn.TransformerEncoder(norm=LayerNorm)``; post-norm stacks need none. The block class
    says which (``final_norm``). A stack of non-causal blocks is an encoder; with ``causal=True`` it is
    the decoder of a decoder-only language model.

    Args:
        block: ``PreNormBlock`` or ``PostNormBlock`` (the class).
        n_layers: ``L``; the other keyword arguments (``d_ff``, ``activation``, ``dropout``, ``eps``,
            ``causal``) go to each block.
    """

    def __init__(self, block: type[_Block], n_layers: int, d_model: int, H: int, **kwargs) -> None:
        super().__init__()
        if n_layers < 1:
            raise ValueError(f"a stack needs at least one block, got n_layers={n_layers}")
        self.blocks = nn.ModuleList(block(d_model, H, **kwargs) for _ in range(n_layers))
        eps = kwargs.get("eps", 1e-5)
        self.final_norm = LayerNorm(d_model, eps) if block.final_norm else nn.Identity()

    def forward(
        self, X: Tensor, mask: Tensor | None = None, caches: list[KVCache] | None = None
    ) -> Tensor:
        if caches is not None and len(caches) != len(self.blocks):
            raise ValueError(
                f"{len(caches)} caches for {len(self.blocks)} blocks; pass one per block"
            )
        for ell, block in enumerate(self.blocks):
            X = block(X, mask, None if caches is None else caches[ell])  # (B, N, D)
        return self.final_norm(X)
