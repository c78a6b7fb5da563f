"""Notation and conventions: Turner's column form and the course's row form.

Chapter: *Notation and conventions*. The course stores tokens as rows (``X`` is ``N x D``, batched
``(B, N, D)``), as Bishop, MIT 6.390, Dramko and PyTorch do. Turner (2023) stores them as columns
(``X`` is ``D x N``), writes parameters as ``U`` matrices acting on the left, and normalises his
attention matrix over columns. This module writes single-head self-attention exactly in Turner's form
so the book can show, number for number, that it equals the row form of :mod:`.self_attention`.

Translation (single head): ``X_cols = X.T``, ``U_q = W_q.T``, ``U_k = W_k.T``, ``U_v = W_v.T``; then
``A_cols = A.T`` and ``Y_cols = Y.T``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "columns_to_rows",
    "low_rank_V",
    "rows_to_columns",
    "turner_attention",
    "turner_multi_head_self_attention",
    "turner_self_attention",
]


def rows_to_columns(X: Tensor) -> Tensor:
    """``(..., N, D)`` tokens-as-rows to Turner's ``(..., D, N)`` tokens-as-columns."""
    if not isinstance(X, Tensor) or X.dim() < 2:
        raise ValueError("X must be a tensor with at least 2 dimensions (..., N, D)")
    return X.transpose(-2, -1)


def columns_to_rows(X_cols: Tensor) -> Tensor:
    """Turner's ``(..., D, N)`` back to the course's ``(..., N, D)``."""
    if not isinstance(X_cols, Tensor) or X_cols.dim() < 2:
        raise ValueError("X_cols must be a tensor with at least 2 dimensions (..., D, N)")
    return X_cols.transpose(-2, -1)


def _check_U(X_cols: Tensor, **U: Tensor) -> None:
    if not isinstance(X_cols, Tensor) or X_cols.dim() != 2:
        raise ValueError("X_cols must be one sequence as a D x N matrix (tokens are columns)")
    D = X_cols.shape[0]
    for name, u in U.items():
        if u.dim() != 2 or u.shape[1] != D:
            hint = (
                " (it looks transposed: Turner's U acts on the left, U x_n)"
                if u.shape[0] == D
                else ""
            )
            raise ValueError(
                f"{name} has shape {tuple(u.shape)} but must be (K, D) with D={D} "
                f"for X_cols of shape {tuple(X_cols.shape)}{hint}"
            )


def turner_attention(
    X_cols: Tensor, U_q: Tensor, U_k: Tensor, scale: float | None = None
) -> Tensor:
    r"""Turner's attention matrix, book eq. ``eq-turner-attention`` (Turner 2023, eq. 5; per head,
    ``eq-mh-turner-A``). The exponent is :math:`\mathbf{k}_{n'}^\top\mathbf{q}_n`, the corrected form of
    the one his eq. 3 prints (see *Where the sources differ*).

    Implements: eq-turner-attention, eq-mh-turner-A, eq-turner-eq3-fixed

    .. math:: A_{n',n} = \frac{\exp\big(\mathbf{k}_{n'}^\top \mathbf{q}_n \, s\big)}
              {\sum_{n''=1}^{N} \exp\big(\mathbf{k}_{n''}^\top \mathbf{q}_n \, s\big)},\qquad
              \mathbf{q}_n = U_q \mathbf{x}_n,\ \mathbf{k}_n = U_k \mathbf{x}_n

    Column ``n`` belongs to the output token ``n`` and sums to one over ``n'``. Turner absorbs the
    scale into ``U_q``; here ``scale`` (default ``1/sqrt(K)``) is explicit so both forms can be
    compared with the same parameters.

    Args:
        X_cols: ``(D, N)``, one token per column.
        U_q, U_k: ``(K, D)``.

    Returns:
        ``A_cols`` of shape ``(N, N)`` with columns summing to one.
    """
    _check_U(X_cols, U_q=U_q, U_k=U_k)
    s = 1.0 / math.sqrt(U_q.shape[0]) if scale is None else float(scale)
    Q_cols, K_cols = U_q @ X_cols, U_k @ X_cols  # (K, N) each: column n is q_n, k_n
    S_cols = (K_cols.T @ Q_cols) * s  # (N, N): entry [n', n] = k_{n'} . q_n
    return torch.softmax(S_cols, dim=0)  # normalise each column over n'


def turner_self_attention(
    X_cols: Tensor, U_q: Tensor, U_k: Tensor, U_v: Tensor, scale: float | None = None
) -> Tensor:
    r"""Single-head self-attention in Turner's column form, book eq. ``eq-turner-self-attention``.

    .. math:: Y = U_v X A, \qquad \mathbf{y}_n = \sum_{n'} U_v \mathbf{x}_{n'} A_{n',n}

    Turner's eq. 2, :math:`Y = X A`, has no value map. When ``D_v = D`` this is his eq. 4 with ``H = 1``
    and ``V_1 = U_v`` (his ``V_h`` are ``D x D``); for ``D_v < D`` it is his footnote 13's value map
    :math:`U_{v,1}` without the output map :math:`U_1` that brings the width back to ``D``.

    Implements: eq-turner-self-attention

    Args:
        X_cols: ``(D, N)``; U_q, U_k: ``(K, D)``; U_v: ``(D_v, D)``.

    Returns:
        ``Y_cols`` of shape ``(D_v, N)``; equals ``self_attention.single_head(X, U_q.T, U_k.T, U_v.T).T``.
    """
    _check_U(X_cols, U_v=U_v)
    A_cols = turner_attention(X_cols, U_q, U_k, scale)  # (N, N), columns sum to one
    return U_v @ X_cols @ A_cols  # (D_v, N)


def turner_multi_head_self_attention(
    X_cols: Tensor, U_q: Tensor, U_k: Tensor, V: Tensor, scale: float | None = None
) -> Tensor:
    r"""Turner's multi-head self-attention, book eq. ``eq-mh-turner`` (Turner 2023, eq. 4-6).

    Implements: eq-mh-turner

    .. math:: Y = \sum_{h=1}^{H} V_h\, X A_h,\qquad
              [A_h]_{n',n} = \operatorname{softmax}_{n'}\big(\mathbf{k}_{h,n'}^\top \mathbf{q}_{h,n}\big)

    Args:
        X_cols: ``(D, N)``.
        U_q, U_k: ``(H, K, D)``: one query and one key map per head.
        V: ``(H, D, D)``: one output map per head (Turner's ``V_h``).

    Raises:
        ValueError: if the shapes are not ``(H, K, D)``, ``(H, K, D)`` and ``(H, D, D)``, e.g. a value
            map ``(H, D_v, D)`` with ``D_v < D``, which is not Turner's ``V_h``.
        scale: default ``1/sqrt(K)`` (Turner absorbs it into ``U_q``).

    Returns:
        ``Y_cols`` of shape ``(D, N)``.
    """
    D = X_cols.shape[0] if isinstance(X_cols, Tensor) and X_cols.dim() == 2 else None
    if (
        U_q.dim() != 3
        or U_k.shape != U_q.shape
        or V.dim() != 3
        or V.shape[0] != U_q.shape[0]
        or V.shape[1:] != (D, D)
    ):
        raise ValueError(
            f"expected U_q, U_k of shape (H, K, D) and V of shape (H, D, D) (Turner's V_h map D to "
            f"D) with D={D} from X_cols, got {tuple(U_q.shape)}, {tuple(U_k.shape)}, "
            f"{tuple(V.shape)}"
        )
    return sum(
        V[h] @ X_cols @ turner_attention(X_cols, U_q[h], U_k[h], scale) for h in range(U_q.shape[0])
    )


def low_rank_V(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    r"""Turner's ``V_h`` from the usual value and output maps, book eq. ``eq-mh-lowrank`` (Turner fn. 13;
    Bishop exercise 5).

    Head ``h`` of the concat form contributes :math:`A_h X W_v^{(h)} W_o^{(h)}` (rows), where
    :math:`W_v^{(h)}` is ``D x K`` (columns ``h*K:(h+1)*K`` of ``W_v``) and :math:`W_o^{(h)}` is ``K x D``
    (the same rows of ``W_o``). In Turner's column form that is :math:`V_h X A_h` with

    .. math:: V_h = \big(W_v^{(h)} W_o^{(h)}\big)^\top = U_h U_{v,h},\qquad \operatorname{rank} V_h \le K.

    Implements: eq-mh-lowrank

    Returns:
        ``(H, D, D)``.
    """
    D = W_v.shape[0]
    if W_v.shape != (D, D) or W_o.shape != (D, D) or D % H:
        raise ValueError(
            f"W_v {tuple(W_v.shape)} and W_o {tuple(W_o.shape)} must be (D, D) with D divisible by H={H}"
        )
    K = D // H
    return torch.stack(
        [(W_v[:, h * K : (h + 1) * K] @ W_o[h * K : (h + 1) * K, :]).T for h in range(H)]
    )
