"""Position: sinusoidal encodings, learned position embeddings, and the relative-shift matrix.

Chapter: *Position* (Turner 2023 sec. 3 and footnote 19; the lecture notes on Bishop and Bishop's
chapter 12, ``bishop2024notes``, sec. 2.14 and exercises 7-10; MIT 6.390 sec. 9.5.1). Rows are
positions: an encoding ``R`` is ``(N, D)`` and row ``n`` is added to (or concatenated with) token ``n``.
The argument ``base`` of the sinusoidal functions is the base :math:`\\Omega` of the frequencies
:math:`\\omega_j = \\Omega^{-2j/D}` (Vaswani et al. use ``10000``; the notes call it :math:`L`, a letter
the book keeps for the number of layers).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LearnedPositionalEmbedding", "relative_shift_matrix", "sinusoidal_encoding"]


def _frequencies(D: int, base: float, device=None, dtype=None) -> Tensor:
    j = torch.arange((D + 1) // 2, device=device, dtype=dtype or torch.float32)
    return base ** (-2.0 * j / D)  # (ceil(D/2),): omega_j = base^(-2j/D)


def sinusoidal_encoding(
    N: int, D: int, base: float = 10_000.0, device: torch.device | str | None = None, dtype=None
) -> Tensor:
    r"""Sinusoidal position encoding ``R`` ``(N, D)``: ``R[n, 2j] = sin(omega_j n)``,
    ``R[n, 2j+1] = cos(omega_j n)``, ``omega_j = base^(-2j/D)``; positions and columns from 0.

    Implements: eq-pos-sinusoid, eq-pos-bishop

    Vaswani et al. (2017) use ``base = 10000``; the lecture notes' figure 10 uses 30. For odd ``D`` the last
    column is a sine. Raises ``ValueError`` for ``N < 0``, ``D < 1`` or ``base <= 1``.
    """
    if N < 0 or D < 1:
        raise ValueError(f"need N >= 0 positions and D >= 1 features, got N={N}, D={D}")
    if base <= 1:
        raise ValueError(f"the base must be > 1 (Vaswani et al.: 10000), got {base}")
    n = torch.arange(N, device=device, dtype=dtype or torch.float32)[:, None]  # (N, 1)
    angles = n * _frequencies(D, base, device, dtype)  # (N, ceil(D/2)): omega_j n
    R = torch.empty(N, D, device=device, dtype=dtype or torch.float32)
    R[:, 0::2] = torch.sin(angles)  # columns 2j
    R[:, 1::2] = torch.cos(angles[:, : D // 2])  # columns 2j + 1
    return R


def relative_shift_matrix(
    k: int, D: int, base: float = 10_000.0, device: torch.device | str | None = None, dtype=None
) -> Tensor:
    r"""The rotation ``Phi_k`` ``(D, D)`` with ``r_{n+k} = Phi_k r_n`` for every ``n`` (the
    lecture notes' exercise 10): block diagonal, one 2x2 block
    ``[[cos w k, sin w k], [-sin w k, cos w k]]`` per frequency ``w = omega_j``. In rows,
    ``R[n + k] = R[n] @ Phi_k.T``.

    Implements: eq-pos-rotation, eq-pos-shift

    ``D`` must be even (``ValueError``): a lone sine column has no partner to rotate with.
    Float64 unless ``dtype`` says otherwise.
    """
    if D % 2:
        raise ValueError(f"the shift matrix needs an even D (sine/cosine pairs), got D={D}")
    omega = _frequencies(D, base, device, dtype or torch.float64)  # (D/2,)
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    Phi = torch.zeros(D, D, device=device, dtype=dtype or torch.float64)
    i = torch.arange(0, D, 2, device=device)  # the sine column of each pair
    Phi[i, i], Phi[i, i + 1] = c, s
    Phi[i + 1, i], Phi[i + 1, i + 1] = -s, c
    return Phi


class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per position, added to the tokens: ``X + R[start : start + N]``.

    Implements: eq-pos-learned, eq-pos-add

    The table ``R`` (``table.weight``) has ``C = max_len`` rows of width ``D = d_model``, rows
    ``0 .. C - 1`` for positions ``0 .. C - 1``. Positions outside them (a sequence that reaches beyond
    row ``C - 1``, or a negative ``start``) raise ``ValueError``: a learned table has no row for them.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, X: Tensor, start: int = 0) -> Tensor:
        """``X`` ``(B, N, D)``; ``start > 0`` when earlier positions sit in a KV cache."""
        N = X.shape[-2]
        if start < 0:
            raise ValueError(f"start={start}: positions count from 0, so start must be >= 0")
        if start + N > self.max_len:
            raise ValueError(
                f"positions {start}..{start + N - 1} go beyond the {self.max_len} learned positions; "
                "crop the sequence to the context or build the model with a longer context"
            )
        positions = torch.arange(start, start + N, device=X.device)
        return X + self.table(positions)  # (B, N, D) + (N, D)
