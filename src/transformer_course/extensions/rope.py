"""Extensions: rotary position embeddings (RoPE)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..runtime import shape_of as _shape


def rope_frequencies(d: int, base: float = 10_000.0, device=None) -> Tensor:
    r"""The ``d/2`` frequencies :math:`\omega_j = \Omega^{-2j/d}`, ``j = 0 .. d/2 - 1``: those of the
    sinusoidal code (book eq. ``eq-pos-sinusoid``) at width ``d`` (float64; Su et al. write
    :math:`\theta_i` and count ``i`` from 1). ``d`` must be even: RoPE rotates pairs of features."""
    if d < 2 or d % 2:
        raise ValueError(f"RoPE rotates pairs of features, so d must be even and >= 2, got d={d}")
    j = torch.arange(d // 2, device=device, dtype=torch.float64)  # the pairs
    return base ** (-2.0 * j / d)


def _positions(X: Tensor, positions: Tensor | None) -> Tensor:
    N = X.shape[-2]
    if positions is None:
        return torch.arange(N, device=X.device)
    if positions.shape != (N,):
        raise ValueError(
            f"positions has shape {_shape(positions)} but X {_shape(X)} has N={N} tokens; give one "
            "position per token, shape (N,)"
        )
    return positions.to(X.device)


def rope_rotation_matrix(n: int, d: int, base: float = 10_000.0) -> Tensor:
    r"""The rotation :math:`\Theta_n` ``(d, d)`` of position ``n``, book eq. ``eq-ext-rope``: block
    diagonal, one 2x2 block :math:`\begin{bmatrix}\cos n\omega_j & -\sin n\omega_j\\ \sin n\omega_j &
    \cos n\omega_j\end{bmatrix}` per pair of features ``(2j, 2j+1)`` (Su et al. 2024). Float64.

    Orthogonal, with :math:`\Theta_n^\top\Theta_m = \Theta_{m-n}`: the relative property of book eq.
    ``eq-ext-rope-relative``.

    Implements: eq-ext-rope, eq-ext-rope-relative
    """
    angles = n * rope_frequencies(d, base)  # (d/2,)
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.block_diag(*[torch.stack([torch.stack([c[i], -s[i]]), torch.stack([s[i], c[i]])])
                              for i in range(d // 2)])  # fmt: skip


def apply_rope_reference(
    X: Tensor, positions: Tensor | None = None, base: float = 10_000.0
) -> Tensor:
    r"""RoPE in its rotation form, book eq. ``eq-ext-rope``: token ``n`` is rotated by the matrix of its
    position, :math:`\tilde{\mathbf{x}}_n = \Theta_{p_n} \mathbf{x}_n` (in rows, ``X[n] @ Theta^T``), one
    position at a time.

    Args:
        X: queries or keys ``(..., N, d)``, ``d`` even.
        positions: integer positions ``(N,)``; default ``0 .. N-1``.
    """
    positions = _positions(X, positions)
    rows = [
        X[..., n, :] @ rope_rotation_matrix(int(p), X.shape[-1], base).to(X).T
        for n, p in enumerate(positions.tolist())
    ]
    return torch.stack(rows, dim=-2)  # (..., N, d)


def _angles(X: Tensor, positions: Tensor | None, base: float) -> Tensor:
    positions = _positions(X, positions)
    theta = rope_frequencies(X.shape[-1], base, X.device)  # (d/2,) float64
    return positions.double()[:, None] * theta  # (N, d/2)


def apply_rope_complex(
    X: Tensor, positions: Tensor | None = None, base: float = 10_000.0
) -> Tensor:
    r"""RoPE in its complex form, book eq. ``eq-ext-rope-complex``: each pair ``(x_{2j}, x_{2j+1})`` is
    the complex number :math:`z_j = x_{2j} + \mathrm{i}\,x_{2j+1}`, multiplied by
    :math:`e^{\mathrm{i} p_n \omega_j}` (Su et al. 2024). ``X`` ``(..., N, d)``, float32 or
    float64.

    Implements: eq-ext-rope-complex
    """
    z = torch.view_as_complex(X.reshape(*X.shape[:-1], -1, 2).contiguous())  # (..., N, d/2)
    rotation = torch.polar(torch.ones_like(z.real), _angles(X, positions, base).to(z.real.dtype))
    return torch.view_as_real(z * rotation).flatten(-2)  # (..., N, d)


def apply_rope(X: Tensor, positions: Tensor | None = None, base: float = 10_000.0) -> Tensor:
    r"""RoPE, efficient form (book eq. ``eq-ext-rope-fast``, the form Su et al. 2024 recommend): entry-wise,
    no matrices,

    .. math:: \tilde{\mathbf{x}} = \mathbf{x} \odot \cos\boldsymbol{\phi}
              + \operatorname{rot}(\mathbf{x}) \odot \sin\boldsymbol{\phi},\qquad
              \operatorname{rot}(\mathbf{x}) = (-x_1, x_0, -x_3, x_2, \dots),

    with :math:`\boldsymbol{\phi} = (p\omega_0, p\omega_0, p\omega_1, p\omega_1, \dots)` for a
    token at position ``p``. Pairs are adjacent features ("interleaved", as in Su et al.);
    :func:`apply_rope_halves` is the other common layout.

    Args:
        X: ``(..., N, d)`` with ``d`` even; positions: integers ``(N,)``, default ``0 .. N-1``.

    Returns:
        ``(..., N, d)``, the dtype of ``X`` (angles are computed in float64).

    Implements: eq-ext-rope-fast
    """
    angles = _angles(X, positions, base).repeat_interleave(2, dim=-1)  # (N, d): each angle twice
    x = X.unflatten(-1, (-1, 2))  # (..., N, d/2, 2): the pairs
    rotated = torch.stack((-x[..., 1], x[..., 0]), dim=-1).flatten(-2)  # (..., N, d)
    return X * torch.cos(angles).to(X.dtype) + rotated * torch.sin(angles).to(X.dtype)


def apply_rope_halves(X: Tensor, positions: Tensor | None = None, base: float = 10_000.0) -> Tensor:
    """RoPE with feature ``i`` paired with feature ``i + d/2`` (the layout of GPT-NeoX and Hugging
    Face's LLaMA): the same rotation as :func:`apply_rope` up to a fixed permutation of the features,
    which learned ``W_q, W_k`` absorb (book sec. *Two layouts of the pairs*)."""
    angles = _angles(X, positions, base)
    c, s = torch.cos(angles).to(X.dtype), torch.sin(angles).to(X.dtype)
    x0, x1 = X.chunk(2, dim=-1)  # (..., N, d/2) each
    return torch.cat((x0 * c - x1 * s, x0 * s + x1 * c), dim=-1)


class RotaryEmbedding(nn.Module):
    """Rotates queries or keys ``(B, H, N, d_k)`` by the positions ``start .. start + N - 1``
    (:func:`apply_rope`); no parameters. ``start > 0`` continues a sequence held in a key-value
    cache.

    Implements: eq-ext-rope-fast
    """

    def __init__(self, d_k: int, base: float = 10_000.0) -> None:
        super().__init__()
        rope_frequencies(d_k, base)  # raises for odd d_k
        self.d_k, self.base = d_k, base

    def extra_repr(self) -> str:
        return f"d_k={self.d_k}, base={self.base:g}"

    def forward(self, T: Tensor, start: int = 0) -> Tensor:
        positions = torch.arange(start, start + T.shape[-2], device=T.device)
        return apply_rope(T, positions, self.base)
