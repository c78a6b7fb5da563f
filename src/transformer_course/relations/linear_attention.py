"""Relations: linear attention: a recurrent network with a matrix-valued state."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import shape_of as _shape
from ._checks import _check_tokens


def elu_feature_map(x: Tensor) -> Tensor:
    r"""The feature map :math:`\psi(\mathbf{x}) = \operatorname{elu}(\mathbf{x}) + 1` of Katharopoulos
    et al. (2020): positive, so every weight :math:`\psi(\mathbf{q})^\top\psi(\mathbf{k})` is too."""
    return F.elu(x) + 1


def _check_linear(Q: Tensor, K: Tensor, V: Tensor) -> None:
    for name, t in (("Q", Q), ("K", K), ("V", V)):
        _check_tokens(t, name)
    if Q.shape != K.shape or V.shape[:-1] != K.shape[:-1]:
        raise ValueError(
            f"Q {_shape(Q)} and K {_shape(K)} must have one shape (..., N, d_k) and V {_shape(V)} "
            "the shape (..., N, d_v): linear attention here is self-attention, one key per query"
        )


def linear_attention_parallel(
    Q: Tensor,
    K: Tensor,
    V: Tensor,
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
    causal: bool = True,
) -> Tensor:
    r"""Linear attention, all tokens at once, book eq. ``eq-rel-linear``.

    .. math:: \mathbf{y}_n = \frac{\sum_{m \le n} \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)\,
              \mathbf{v}_m}{\sum_{m \le n} \psi(\mathbf{q}_n)^\top\psi(\mathbf{k}_m)}

    (Katharopoulos et al. 2020): attention whose weights are the normalised rows of the masked
    matrix :math:`\psi(Q)\psi(K)^\top`, with no softmax. Causal: an ``(N, N)`` matrix, cost
    :math:`O(N^2 (d_\psi + d_v))` (``2 N^2 (d_psi + d_v)`` FLOPs of matrix products). With
    ``causal=False`` the sums run over all ``m`` and associativity, :math:`\psi(Q)\,(\psi(K)^\top V)`,
    gives cost :math:`O(N d_\psi d_v)` (``4 N d_psi d_v + 2 N d_psi``), linear in ``N``.

    Args:
        Q, K: ``(..., N, d_k)``; V: ``(..., N, d_v)``.
        feature_map: :math:`\psi`, applied row by row; it must give positive features.
        causal: token ``n`` reads tokens ``m <= n`` only.

    Returns:
        ``Y`` of shape ``(..., N, d_v)``; equal to :func:`linear_attention_recurrent` when causal.

    Raises:
        ValueError: when the shapes do not fit.

    Implements: eq-rel-linear
    """
    _check_linear(Q, K, V)
    PQ, PK = feature_map(Q), feature_map(K)  # (..., N, r)
    if not causal:
        num = PQ @ (PK.transpose(-2, -1) @ V)  # (..., N, d_v): the (r, d_v) sum first
        den = PQ @ PK.sum(dim=-2, keepdim=True).transpose(-2, -1)  # (..., N, 1)
        return num / den
    A = (PQ @ PK.transpose(-2, -1)).tril()  # (..., N, N): psi(q_n).psi(k_m) for m <= n, else 0
    return (A @ V) / A.sum(dim=-1, keepdim=True)  # each row normalised


def linear_attention_step(
    Gamma: Tensor,
    zeta: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: Callable[[Tensor], Tensor] = elu_feature_map,
) -> tuple[Tensor, Tensor, Tensor]:
    r"""One step of linear attention as a recurrent network, book eq. ``eq-rel-linear-rnn``.

    .. math:: \Gamma_t = \Gamma_{t-1} + \psi(\mathbf{k}_t)\,\mathbf{v}_t^\top, \qquad
              \boldsymbol{\zeta}_t = \boldsymbol{\zeta}_{t-1} + \psi(\mathbf{k}_t), \qquad
              \mathbf{y}_t = \frac{\Gamma_t^\top \psi(\mathbf{q}_t)}{\boldsymbol{\zeta}_t^\top
              \psi(\mathbf{q}_t)}

    The state :math:`(\Gamma_t, \boldsymbol\zeta_t)` has ``d_psi (d_v + 1)`` numbers whatever ``t`` is,
    so a step costs the same at every position (Katharopoulos et al. 2020).

    Args:
        Gamma: ``(..., d_psi, d_v)``; zeta: ``(..., d_psi)`` (zeros before the first token).
        q, k: ``(..., d_k)``; v: ``(..., d_v)``: the new token's query, key and value.
        feature_map: :math:`\psi` (``d_psi`` features of a ``d_k``-vector).

    Returns:
        ``(Gamma_t, zeta_t, y_t)`` with ``y_t`` of shape ``(..., d_v)``.

    Implements: eq-rel-linear-rnn
    """
    pk, pq = feature_map(k), feature_map(q)  # (..., r)
    Gamma = Gamma + pk[..., :, None] @ v[..., None, :]  # (..., r, d_v): add the outer product
    zeta = zeta + pk  # (..., r)
    num = (pq[..., None, :] @ Gamma)[..., 0, :]  # (..., d_v)
    den = (pq[..., None, :] @ zeta[..., :, None])[..., 0, :]  # (..., 1)
    return Gamma, zeta, num / den


def linear_attention_recurrent(
    Q: Tensor, K: Tensor, V: Tensor, feature_map: Callable[[Tensor], Tensor] = elu_feature_map
) -> Tensor:
    r"""Causal linear attention one token after the other, book eq. ``eq-rel-linear-rnn``: the loop
    of :func:`linear_attention_step` from :math:`\Gamma_0 = 0`, :math:`\boldsymbol\zeta_0 = 0`.

    Same arguments, result and errors as :func:`linear_attention_parallel` with ``causal=True``
    (tested equal).

    Implements: eq-rel-linear-rnn
    """
    _check_linear(Q, K, V)
    r = feature_map(K[..., :1, :]).shape[-1]
    Gamma = Q.new_zeros(*Q.shape[:-2], r, V.shape[-1])  # (..., r, d_v)
    zeta = Q.new_zeros(*Q.shape[:-2], r)  # (..., r)
    ys = []
    for t in range(Q.shape[-2]):
        Gamma, zeta, y = linear_attention_step(
            Gamma, zeta, Q[..., t, :], K[..., t, :], V[..., t, :], feature_map
        )
        ys.append(y)
    return torch.stack(ys, dim=-2)  # (..., N, d_v)
