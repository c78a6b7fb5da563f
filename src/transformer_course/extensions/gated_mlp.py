"""Extensions: gated MLPs."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..runtime import shape_of as _shape

GATES: dict[str, Callable[[Tensor], Tensor]] = {
    "sigmoid": torch.sigmoid,  # GLU (Dauphin et al. 2017)
    "relu": F.relu,  # ReGLU
    "gelu": F.gelu,  # GEGLU
    "silu": F.silu,  # SwiGLU: Swish_1(x) = x * sigmoid(x)
    "identity": lambda x: x,  # bilinear
}


def _gate(name: str) -> Callable[[Tensor], Tensor]:
    try:
        return GATES[name]
    except KeyError:
        raise ValueError(
            f"unknown gate activation {name!r}; choose one of {sorted(GATES)}"
        ) from None


def gated_mlp_reference(
    X: Tensor, W_g: Tensor, W_1: Tensor, W_2: Tensor, activation: str = "silu"
) -> Tensor:
    r"""A gated MLP, book eq. ``eq-ext-glu`` (Shazeer 2020, no biases):

    .. math:: \mathrm{MLP}_\text{gated}(X) = \big(\operatorname{act}(X W_g) \odot X W_1\big) W_2

    with the gate ``W_g`` and ``W_1`` ``(D, d_ff)``, ``W_2`` ``(d_ff, D)`` (``W_1, W_2`` as in the plain
    MLP of book eq. ``eq-block-mlp``) and :math:`\odot` the entry-wise product; the activation
    :math:`\operatorname{act}` = SiLU is SwiGLU, sigmoid the original GLU (Dauphin et al. 2017), GELU
    GEGLU, ReLU ReGLU. Shazeer writes ``W`` for the gate and ``V`` for ``W_1``. ``X`` ``(..., D)``.
    """
    if (
        W_g.shape != W_1.shape
        or W_g.shape[0] != X.shape[-1]
        or W_2.shape != (W_g.shape[1], X.shape[-1])
    ):
        raise ValueError(
            f"need W_g, W_1 of shape (D, d_ff) and W_2 of shape (d_ff, D) for X {_shape(X)}; got W_g "
            f"{_shape(W_g)}, W_1 {_shape(W_1)}, W_2 {_shape(W_2)}"
        )
    return (_gate(activation)(X @ W_g) * (X @ W_1)) @ W_2


class GatedMLP(nn.Module):
    """A gated token-wise MLP, book eq. ``eq-ext-glu``: ``fc1`` holds ``[W_g | W_1]`` (one fused matrix
    product, stored transposed as ``nn.Linear`` does), ``fc2`` holds ``W_2``; no biases.

    ``forward(X (..., N, D)) -> (..., N, D)``; :attr:`weights` gives ``W_g, W_1, W_2`` in the book's
    ``X @ W`` convention.

    Implements: eq-ext-glu
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "silu") -> None:
        super().__init__()
        self.d_ff, self.activation, self.act = d_ff, activation, _gate(activation)
        self.fc1 = nn.Linear(d_model, 2 * d_ff, bias=False)  # rows: W_g^T then W_1^T
        self.fc2 = nn.Linear(d_ff, d_model, bias=False)  # W_2^T

    def forward(self, X: Tensor) -> Tensor:
        gate, up = self.fc1(X).chunk(2, dim=-1)  # X W_g, X W_1: (..., N, d_ff) each
        return self.fc2(self.act(gate) * up)  # (..., N, D)

    @property
    def weights(self) -> dict[str, Tensor]:
        W_g_t, W_1_t = self.fc1.weight.detach().split(self.d_ff, dim=0)
        return {"W_g": W_g_t.T, "W_1": W_1_t.T, "W_2": self.fc2.weight.detach().T}


def swiglu_hidden(d_model: int, multiple_of: int = 1) -> int:
    r"""The hidden width that gives a gated MLP the parameters of a ``4D`` two-matrix MLP, book eq.
    ``eq-ext-dff``: :math:`3 D d_\text{ff} = 2 D (4D)`, so :math:`d_\text{ff} = 8D/3`, rounded to the
    nearest integer and then up to a multiple of ``multiple_of`` (Shazeer 2020 scales ``d_ff`` by 2/3;
    LLaMA rounds up to a multiple of 256).

    Implements: eq-ext-dff
    """
    if d_model < 1 or multiple_of < 1:
        raise ValueError(f"need d_model >= 1 and multiple_of >= 1, got {d_model}, {multiple_of}")
    d_ff = round(8 * d_model / 3)
    return multiple_of * -(-d_ff // multiple_of)


class SwiGLU(GatedMLP):
    """The SwiGLU MLP (SiLU gate), sized by :func:`swiglu_hidden` unless ``d_ff`` is given."""

    def __init__(self, d_model: int, d_ff: int | None = None) -> None:
        super().__init__(d_model, d_ff or swiglu_hidden(d_model), "silu")
