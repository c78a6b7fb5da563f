"""Position: sinusoidal encodings, learned position embeddings, and the relative-shift matrix.

Chapter: *Position* (Turner 2023 sec. 3 and footnote 19; Bishop & Bishop 2024 sec. 2.14 and exercises
7-10; MIT 6.390 sec. 9.5.1). Rows are positions: an encoding ``R`` is ``(N, D)`` and row ``n`` is added
to (or concatenated with) token ``n``. The argument ``L`` of the sinusoidal functions is the base
:math:`b` of the frequencies (Bishop's letter is ``L``; the book writes :math:`b`, keeping :math:`L` for
the number of layers); Vaswani et al. use ``10000``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["LearnedPositionalEmbedding", "relative_shift_matrix", "sinusoidal_encoding"]


def _frequencies(D: int, L: float, device=None, dtype=None) -> Tensor:
    k = torch.arange((D + 1) // 2, device=device, dtype=dtype or torch.float32)
    return L ** (-2.0 * k / D)  # (ceil(D/2),): omega_k = L^(-2k/D)


def sinusoidal_encoding(
    N: int, D: int, L: float = 10_000.0, device: torch.device | str | None = None, dtype=None
) -> Tensor:
    r"""Sinusoidal position encoding, book eqs. ``eq-pos-sinusoid`` and ``eq-pos-bishop`` (Vaswani et al.
    2017; Bishop eq. 25).

    .. math:: R_{n,2k} = \sin(\omega_k n),\qquad R_{n,2k+1} = \cos(\omega_k n),\qquad
              \omega_k = b^{-2k/D}

    Bishop writes :math:`\sin(n / L^{i/D})` for even ``i`` and :math:`\cos(n/L^{(i-1)/D})` for odd ``i``,
    with his ``L`` for the base: the same numbers once ``i = 2k``. Vaswani et al. use ``b = 10000``;
    Bishop's figure 10 uses ``b = 30``. Positions ``n`` and columns run from 0. For odd ``D`` the last
    column is a sine.

    Args:
        N: positions; D: width of the code.
        L: the base :math:`b` of the frequencies (must be > 1).

    Returns:
        ``R`` of shape ``(N, D)``.

    Raises:
        ValueError: for ``N < 0``, ``D < 1`` or a base ``L <= 1``.
    """
    if N < 0 or D < 1:
        raise ValueError(f"need N >= 0 positions and D >= 1 features, got N={N}, D={D}")
    if L <= 1:
        raise ValueError(f"the length scale L must be > 1 (Vaswani: 10000), got {L}")
    n = torch.arange(N, device=device, dtype=dtype or torch.float32)[:, None]  # (N, 1)
    angles = n * _frequencies(D, L, device, dtype)  # (N, ceil(D/2))
    R = torch.empty(N, D, device=device, dtype=dtype or torch.float32)
    R[:, 0::2] = torch.sin(angles)
    R[:, 1::2] = torch.cos(angles[:, : D // 2])
    return R


def relative_shift_matrix(
    k: int, D: int, L: float = 10_000.0, device: torch.device | str | None = None, dtype=None
) -> Tensor:
    r"""The matrix :math:`\Phi_k` with :math:`\mathbf{r}_{n+k} = \Phi_k \mathbf{r}_n` for every ``n``, book
    eqs. ``eq-pos-shift`` and ``eq-pos-rotation`` (Bishop exercise 10).

    :math:`\Phi_k` (``D x D``) is block diagonal with one 2x2 rotation per frequency,

    .. math:: \begin{bmatrix}\sin\omega(n+k)\\ \cos\omega(n+k)\end{bmatrix} =
              \begin{bmatrix}\cos\omega k & \sin\omega k\\ -\sin\omega k & \cos\omega k\end{bmatrix}
              \begin{bmatrix}\sin\omega n\\ \cos\omega n\end{bmatrix},

    so it depends on the offset ``k`` but not on ``n``. In the row form, ``R[n + k] = R[n] @ Phi_k.T``.
    ``L`` is the base :math:`b`, as in :func:`sinusoidal_encoding`. ``D`` must be even (``ValueError``
    otherwise): a lone sine column has no partner to rotate with. The result is float64 unless
    ``dtype`` says otherwise.
    """
    if D % 2:
        raise ValueError(f"the shift matrix needs an even D (sine/cosine pairs), got D={D}")
    omega = _frequencies(D, L, device, dtype or torch.float64)  # (D/2,)
    c, s = torch.cos(omega * k), torch.sin(omega * k)
    Phi = torch.zeros(D, D, device=device, dtype=dtype or torch.float64)
    idx = torch.arange(0, D, 2, device=device)
    Phi[idx, idx], Phi[idx, idx + 1] = c, s
    Phi[idx + 1, idx], Phi[idx + 1, idx + 1] = -s, c
    return Phi


class LearnedPositionalEmbedding(nn.Module):
    """A learned vector per position, book eq. ``eq-pos-learned``, added to the tokens as in eq.
    ``eq-pos-add`` (Bishop sec. 2.14.4; GPT, BERT, ViT).

    The table ``R`` (``table.weight``) has ``C = max_len`` rows of width ``D = d_model``; ``forward(X)``
    adds its rows ``0 .. N-1`` to the tokens ``X`` ``(B, N, D)``. Sequences longer than ``max_len``
    raise ``ValueError``: a learned table has no row for an unseen position.
    """

    def __init__(self, max_len: int, d_model: int) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, std=0.02)

    def forward(self, X: Tensor, start: int = 0) -> Tensor:
        """Add the embeddings of positions ``start .. start + N - 1`` (``start > 0`` with a KV cache)."""
        N = X.shape[-2]
        if start + N > self.max_len:
            raise ValueError(
                f"positions {start}..{start + N - 1} go beyond the {self.max_len} learned positions; "
                "crop the sequence to the context or build the model with a longer context"
            )
        positions = torch.arange(start, start + N, device=X.device)
        return X + self.table(positions)  # (B, N, D) + (N, D)
