"""Figures shared by the chapters and labs (matplotlib only; every figure is drawn from data).

Chapters: all. A function here draws; it never computes a model quantity itself, so the numbers in
a figure always come from the package's tested functions.
"""

from __future__ import annotations

from collections.abc import Sequence

import matplotlib.pyplot as plt
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from torch import Tensor

__all__ = ["attention_heatmap"]


def attention_heatmap(
    A: Tensor,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool | None = None,
    vmax: float | None = 1.0,
) -> Figure:
    """Draw attention weights ``A`` (N queries x M keys, rows are queries) as a heat map.

    Args:
        A: ``(N, M)`` weights (any tensor or array; detached and moved to the CPU here).
        queries, keys: tick labels for rows and columns (e.g. the words of a sentence).
        ax: axes to draw into; a new figure is made when ``None``.
        title: axes title.
        annotate: write each weight in its cell; default when the matrix is at most 12 x 12.
        vmax: upper end of the colour scale (``None``: the largest weight). When ``A`` has negative
            entries (a general filter, not attention weights) a diverging scale centred on 0 is used.

    Returns:
        The figure that holds the axes.

    Raises:
        ValueError: when ``A`` is not 2-D or the label counts do not match its shape.
    """
    A = torch.as_tensor(A).detach().cpu().float()
    if A.dim() != 2:
        raise ValueError(f"A must be a 2-D (queries x keys) matrix, got shape {tuple(A.shape)}")
    N, M = A.shape
    if queries is not None and len(queries) != N:
        raise ValueError(f"{len(queries)} query labels for {N} rows of A")
    if keys is not None and len(keys) != M:
        raise ValueError(f"{len(keys)} key labels for {M} columns of A")
    if ax is None:
        fig, ax = plt.subplots(figsize=(0.5 * M + 2.0, 0.5 * N + 1.2))
    else:
        fig = ax.figure
    if float(A.min()) < 0:  # not attention weights: show the sign with a diverging scale
        top = float(A.abs().max()) if vmax is None else max(vmax, float(A.abs().max()))
        im = ax.imshow(A.numpy(), cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
    else:
        im = ax.imshow(A.numpy(), cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    ax.set_xticks(
        range(M), labels=list(keys) if keys is not None else range(M), rotation=45, ha="right"
    )
    ax.set_yticks(range(N), labels=list(queries) if queries is not None else range(N))
    ax.set_xlabel("key m")
    ax.set_ylabel("query n")
    if title:
        ax.set_title(title)
    if annotate if annotate is not None else max(N, M) <= 12:
        top = float(A.max()) if vmax is None else vmax
        for n in range(N):
            for m in range(M):
                colour = "black" if abs(A[n, m]) > 0.6 * top or float(A.min()) < 0 else "white"
                ax.text(m, n, f"{A[n, m]:.2f}", ha="center", va="center", fontsize=7, color=colour)
    fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    return fig
