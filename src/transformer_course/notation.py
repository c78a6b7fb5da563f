"""Notation and conventions: Turner's column form and the course's row form.

Chapter: *Notation and conventions*. The course stores the tokens of a sequence as rows (``X`` is
``N x D``), as the lecture notes on Bishop & Bishop, MIT 6.390 and Dramko do, batches them as
``(B, N, D)``, as Dramko and PyTorch's layers built with ``batch_first=True`` do, and multiplies by its
maps from the right (``X @ W_q`` with ``W_q`` of shape ``(D, d_k)``). Turner (2023) stores tokens as
columns (``X`` is ``D x N``), applies his maps from the left (``U_q x_n`` with ``U_q`` of shape
``(d_k, D)``, his ``K x D``), and normalises his attention matrix over columns. This module writes
single-head self-attention exactly in Turner's form, its arguments named with his letters, so the
book can show, number for number, that it equals the row form of :mod:`.self_attention`.

Translation (single head): ``X_cols = X.T``, and each of Turner's left-acting maps is the course's
right-acting map transposed: ``U_q = W_q.T``, ``U_k = W_k.T``, ``U_v = W_v.T``; then ``A_cols = A.T``
and ``Y_cols = Y.T``. (Turner's own value maps, ``U_{v,h}`` of his footnote 13, have the queries' width;
the course lets ``d_v`` differ from ``d_k``.) The head width is written ``d_k`` here, never Turner's
``K``, which the course keeps for the matrix of keys.
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
    """``(..., N, D)`` tokens-as-rows to Turner's ``(..., D, N)`` tokens-as-columns (a transpose)."""
    if not isinstance(X, Tensor) or X.dim() < 2:
        raise ValueError("X must be a tensor with at least 2 dimensions (..., N, D)")
    return X.transpose(-2, -1)


def columns_to_rows(X_cols: Tensor) -> Tensor:
    """Turner's ``(..., D, N)`` back to the course's ``(..., N, D)`` (a transpose)."""
    if not isinstance(X_cols, Tensor) or X_cols.dim() < 2:
        raise ValueError("X_cols must be a tensor with at least 2 dimensions (..., D, N)")
    return X_cols.transpose(-2, -1)


def _check_X_cols(X_cols: Tensor) -> int:
    """``D`` of one ``D x N`` sequence; a ValueError that names the shape otherwise."""
    if not isinstance(X_cols, Tensor) or X_cols.dim() != 2:
        shape = tuple(X_cols.shape) if isinstance(X_cols, Tensor) else type(X_cols).__name__
        raise ValueError(
            f"X_cols has shape {shape} but must be one sequence as a D x N matrix (tokens are "
            "columns); Turner's functions take one sequence: loop over a batch, or use the row form"
        )
    return X_cols.shape[0]


def _check_U(X_cols: Tensor, width: str, **U: Tensor) -> None:
    """Each map ``U`` must be ``(width, D)``, acting from the left on the columns of ``X_cols``."""
    D = _check_X_cols(X_cols)
    for name, u in U.items():
        if not isinstance(u, Tensor) or u.dim() != 2 or u.shape[1] != D:
            shape = tuple(u.shape) if isinstance(u, Tensor) else type(u).__name__
            hint = (
                " (it looks transposed: Turner's maps act on the left, U x_n)"
                if isinstance(u, Tensor) and u.dim() == 2 and u.shape[0] == D
                else ""
            )
            raise ValueError(
                f"{name} has shape {shape} but must be ({width}, D) with D={D} "
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
    scale into his maps (his footnote 8 says into ``U``); here ``scale`` (default ``1/sqrt(d_k)``) is
    explicit so both forms can be compared with the same parameters.

    Args:
        X_cols: ``(D, N)``, one token per column.
        U_q, U_k: ``(d_k, D)`` each (Turner's ``K x D``), acting from the left: the course's ``W_q.T``
            and ``W_k.T``.
        scale: the factor of the scores; default ``1/sqrt(d_k)``.

    Returns:
        ``A_cols`` of shape ``(N, N)`` with columns summing to one.

    Raises:
        ValueError: if ``X_cols`` is not one ``D x N`` matrix, a map is not ``(d_k, D)`` (with a hint
            when it looks transposed, i.e. given in the course's ``(D, d_k)`` layout), or ``U_q`` and
            ``U_k`` have different widths. Each message names the shape it refuses.
    """
    _check_U(X_cols, "d_k", U_q=U_q, U_k=U_k)
    if U_q.shape != U_k.shape:
        raise ValueError(
            f"U_q has shape {tuple(U_q.shape)} but U_k has shape {tuple(U_k.shape)}: queries and keys "
            "must have the same width d_k for their dot products"
        )
    s = 1.0 / math.sqrt(U_q.shape[0]) if scale is None else float(scale)
    Q_cols, K_cols = U_q @ X_cols, U_k @ X_cols  # (d_k, N) each: column n is q_n, k_n
    S_cols = (K_cols.T @ Q_cols) * s  # (N, N): entry [n', n] = k_{n'} . q_n
    return torch.softmax(S_cols, dim=0)  # normalise each column over n'


def turner_self_attention(
    X_cols: Tensor, U_q: Tensor, U_k: Tensor, U_v: Tensor, scale: float | None = None
) -> Tensor:
    r"""Single-head self-attention in Turner's column form, book eq. ``eq-turner-self-attention``.

    .. math:: Y = U_v X A, \qquad \mathbf{y}_n = \sum_{n'} U_v \mathbf{x}_{n'} A_{n',n}

    Turner's eq. 2, :math:`Y = X A`, has no value map. When ``d_v = D`` this is his eq. 4 with
    ``H = 1`` and ``V_1 = U_v`` (his ``V_h``, the course's ``U_{o,h}``, are ``D x D``). Otherwise
    ``U_v`` is a value map like his footnote 13's :math:`U_{v,1}` (which has the queries' width), without
    the ``D x d_k`` map that his footnote puts after it to bring the width back to ``D``.

    Implements: eq-turner-self-attention

    Args:
        X_cols: ``(D, N)``; U_q, U_k: ``(d_k, D)``; U_v: ``(d_v, D)``, all acting from the left (the
            course's ``W_q.T``, ``W_k.T``, ``W_v.T``).
        scale: the factor of the scores; default ``1/sqrt(d_k)``.

    Returns:
        ``Y_cols`` of shape ``(d_v, N)``; equals ``self_attention.single_head(X, U_q.T, U_k.T, U_v.T).T``.

    Raises:
        ValueError: as :func:`turner_attention`, or if ``U_v`` is not ``(d_v, D)``.
    """
    _check_U(X_cols, "d_v", U_v=U_v)
    A_cols = turner_attention(X_cols, U_q, U_k, scale)  # (N, N), columns sum to one
    return U_v @ X_cols @ A_cols  # (d_v, N)


def turner_multi_head_self_attention(
    X_cols: Tensor, U_q: Tensor, U_k: Tensor, U_o: Tensor, scale: float | None = None
) -> Tensor:
    r"""Turner's multi-head self-attention, book eq. ``eq-mh-turner`` (Turner 2023, eq. 4-6).

    Implements: eq-mh-turner

    .. math:: Y = \sum_{h=1}^{H} U_{o,h}\, X A_h,\qquad
              [A_h]_{n',n} = \operatorname{softmax}_{n'}\big(\mathbf{k}_{h,n'}^\top \mathbf{q}_{h,n}\big)

    Turner writes the output map of head ``h`` as ``V_h``; the course writes ``U_{o,h}``, since its
    ``V`` is the matrix of values.

    Args:
        X_cols: ``(D, N)``.
        U_q, U_k: ``(H, d_k, D)``: one query and one key map per head, acting from the left.
        U_o: ``(H, D, D)``: one output map per head (Turner's ``V_h``).
        scale: the factor of the scores; default ``1/sqrt(d_k)`` (Turner absorbs it into his maps).

    Returns:
        ``Y_cols`` of shape ``(D, N)``.

    Raises:
        ValueError: if the shapes are not ``(H, d_k, D)``, ``(H, d_k, D)`` and ``(H, D, D)``, e.g. an
            output map ``(H, d_v, D)`` with ``d_v < D``, which is not Turner's ``V_h``.
    """
    D = X_cols.shape[0] if isinstance(X_cols, Tensor) and X_cols.dim() == 2 else None
    if (
        U_q.dim() != 3
        or U_k.shape != U_q.shape
        or U_o.dim() != 3
        or U_o.shape[0] != U_q.shape[0]
        or U_o.shape[1:] != (D, D)
    ):
        raise ValueError(
            f"expected U_q, U_k of shape (H, d_k, D) and U_o of shape (H, D, D) (Turner's V_h map D "
            f"to D) with D={D} from X_cols, got {tuple(U_q.shape)}, {tuple(U_k.shape)}, "
            f"{tuple(U_o.shape)}"
        )
    return sum(
        U_o[h] @ X_cols @ turner_attention(X_cols, U_q[h], U_k[h], scale)
        for h in range(U_q.shape[0])
    )


def low_rank_V(W_v: Tensor, W_o: Tensor, H: int) -> Tensor:
    r"""Turner's output maps ``V_h`` (the course's ``U_{o,h}``) from the usual value and output maps,
    book eq. ``eq-mh-lowrank`` (Turner fn. 13; exercise 5 of the lecture notes on Bishop & Bishop).

    Head ``h`` of the concat form contributes :math:`A_h X W_v^{(h)} W_o^{(h)}` (rows), where
    :math:`W_v^{(h)}` is ``D x d_k`` (columns ``h*d_k:(h+1)*d_k`` of ``W_v``) and :math:`W_o^{(h)}` is
    ``d_k x D`` (the same rows of ``W_o``), with ``d_k = D / H``. In Turner's column form that is
    :math:`U_{o,h} X A_h` with

    .. math:: U_{o,h} = \big(W_v^{(h)} W_o^{(h)}\big)^\top = U_h U_{v,h},\qquad
              \operatorname{rank} U_{o,h} \le d_k.

    Implements: eq-mh-lowrank

    Returns:
        ``(H, D, D)``.

    Raises:
        ValueError: if ``W_v`` or ``W_o`` is not ``(D, D)``, or ``H`` does not divide ``D``.
    """
    D = W_v.shape[0]
    if W_v.shape != (D, D) or W_o.shape != (D, D) or D % H:
        raise ValueError(
            f"W_v {tuple(W_v.shape)} and W_o {tuple(W_o.shape)} must be (D, D) with D divisible by H={H}"
        )
    d_k = D // H
    return torch.stack(
        [(W_v[:, h * d_k : (h + 1) * d_k] @ W_o[h * d_k : (h + 1) * d_k, :]).T for h in range(H)]
    )
