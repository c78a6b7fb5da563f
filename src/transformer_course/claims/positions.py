"""Claims: position layers, each mapping the token vectors (B, N, d_tok) to X^(0) (B, N, D)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..position import sinusoidal_encoding


class AddedPositions(nn.Module):
    r"""Learned positions added to the tokens, book eq. ``eq-pos-learned``: :math:`X^{(0)} = X + R`,
    ``R`` of ``max_len`` rows (``table.weight``, ``(max_len, D)``).

    Beyond the table a learned code needs a rule. With ``clamp=True`` every position
    ``n >= max_len`` reuses the last row, :math:`\mathbf r_n = \mathbf r_{C-1}`; otherwise such a
    sequence raises ``ValueError``. (A table longer than the training windows is the other rule: its
    extra rows never receive a gradient.)
    """

    d_extra = 0

    def __init__(self, max_len: int, d_model: int, clamp: bool = False) -> None:
        super().__init__()
        self.max_len, self.clamp = max_len, clamp
        self.table = nn.Embedding(max_len, d_model)

    def forward(self, X: Tensor) -> Tensor:
        N = X.shape[-2]
        if N > self.max_len and not self.clamp:
            raise ValueError(
                f"{N} positions but only {self.max_len} learned rows; use clamp=True or a longer table"
            )
        n = torch.arange(N, device=X.device).clamp(max=self.max_len - 1)
        return X + self.table(n)  # (B, N, D) + (N, D)


class ConcatenatedPositions(nn.Module):
    r"""Learned positions concatenated with the tokens, book eq. ``eq-claims-concat``:
    :math:`\mathbf x^{(0)}_n = [\mathbf x_n;\ \mathbf r_n]`, ``R`` of shape ``(max_len, d_pos)``;
    the tokens are ``D - d_pos`` wide, ``X^(0)`` is ``D`` wide (``d_extra = d_pos``).

    Implements: eq-claims-concat
    """

    def __init__(self, max_len: int, d_pos: int) -> None:
        super().__init__()
        self.max_len, self.d_extra = max_len, d_pos
        self.table = nn.Embedding(max_len, d_pos)

    def forward(self, X: Tensor) -> Tensor:
        B, N = X.shape[:-2], X.shape[-2]
        if N > self.max_len:
            raise ValueError(f"{N} positions but only {self.max_len} learned rows")
        R = self.table(torch.arange(N, device=X.device))  # (N, d_pos)
        return torch.cat([X, R.expand(*B, N, self.d_extra)], dim=-1)  # (B, N, d_tok + d_pos)


class SinusoidalPositions(nn.Module):
    r"""Sinusoidal codes added to the tokens, book eq. ``eq-pos-sinusoid``, for any length ``N``
    (computed on the fly by :func:`.position.sinusoidal_encoding`; base :math:`\Omega` = ``base``)."""

    d_extra = 0

    def __init__(self, d_model: int, base: float = 10_000.0) -> None:
        super().__init__()
        self.d_model, self.base = d_model, base

    def forward(self, X: Tensor) -> Tensor:
        R = sinusoidal_encoding(X.shape[-2], self.d_model, self.base, X.device, X.dtype)  # (N, D)
        return X + R


class NoPositions(nn.Module):
    """No position code at all: :math:`X^{(0)} = X` (a causal mask still tells tokens apart by how
    many others each one sees)."""

    d_extra = 0

    def forward(self, X: Tensor) -> Tensor:
        return X
