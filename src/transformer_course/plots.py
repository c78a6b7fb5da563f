"""Figures shared by the chapters and labs (matplotlib only; every figure is drawn from data).

Shared infrastructure of every chapter. A function here draws; it never computes a model quantity
itself, so the numbers in a figure always come from the package's tested functions:
:func:`attention_heatmap` draws a matrix of weights, and :class:`Diagram` draws how data flows through a
layer, with every tensor drawn to the shape the real module produced (the chapters run the module and
pass its tensors in). Figures have a white background of their own, so they read in light and dark mode.

:func:`describe` says in words what a figure shows, read from the figure itself (titles, axes, curves).
While the package is imported, every PNG that matplotlib writes carries that description in its
``Description`` field, and the book's extension makes it the figure's alt text.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle
from torch import Tensor

__all__ = ["Diagram", "attention_heatmap", "describe"]


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


@dataclass(frozen=True)
class _Node:
    x: float  # centre
    y: float
    w: float  # full width and height
    h: float


class Diagram:
    """A data-flow figure: tensors as rectangles drawn to their shape, operations as rounded boxes, and
    arrows between them.

    A tensor's last two dimensions (rows = tokens, columns = features) set the rectangle's height and
    width, ``unit`` data units per entry, so a ``6 x 4`` query matrix is drawn half as wide as a
    ``6 x 8`` input; leading (batch, head) dimensions are listed in the label. Give the tensors the real
    module computed, and the figure cannot disagree with the code::

        d = Diagram(unit=0.25)
        d.tensor("X", X, 0, 0)
        d.op("W_q", 2, 0)
        d.tensor("Q", Q, 4, 0)
        d.arrow("X", "W_q")
        d.arrow("W_q", "Q")
        d.finish("title")

    Args:
        ax: axes to draw into; a new figure is made when ``None``.
        unit: size of one matrix entry in data units.
        figsize: size of a new figure, inches.
    """

    COLOURS: ClassVar[dict[str, str]] = {
        "tensor": "#dbe9f6",
        "op": "#fde7c8",
        "edge": "#2b4a6f",
        "text": "black",
    }

    def __init__(self, ax: Axes | None = None, unit: float = 0.25, figsize=(9.0, 3.5)) -> None:
        if ax is None:
            _, ax = plt.subplots(figsize=figsize)
        self.ax, self.fig, self.unit = ax, ax.figure, unit
        self.nodes: dict[str, _Node] = {}
        self.fig.set_facecolor("white")
        ax.set_facecolor("white")
        ax.set_aspect("equal")
        ax.axis("off")

    def _add(self, name: str, node: _Node) -> str:
        if name in self.nodes:
            raise ValueError(f"the diagram already has a node named {name!r}; give each one a name")
        self.nodes[name] = node
        return name

    def tensor(
        self,
        name: str,
        T: Tensor | Sequence[int],
        x: float,
        y: float,
        label: str | None = None,
        colour: str | None = None,
    ) -> str:
        """Draw ``T`` (a tensor or its shape) centred at ``(x, y)``; the label shows its shape."""
        shape = tuple(T.shape) if isinstance(T, Tensor) else tuple(int(s) for s in T)
        if not shape:
            raise ValueError(f"{name}: a scalar has no rows or columns to draw")
        rows, cols = (1, shape[0]) if len(shape) == 1 else shape[-2:]
        w, h = cols * self.unit, rows * self.unit
        self.ax.add_patch(
            Rectangle(
                (x - w / 2, y - h / 2), w, h,
                facecolor=colour or self.COLOURS["tensor"], edgecolor=self.COLOURS["edge"], lw=1.2,
                zorder=2,
            )
        )  # fmt: skip
        dims = " x ".join(str(s) for s in shape)
        self.ax.text(x, y - h / 2 - 0.12, f"{label or name}\n({dims})", ha="center", va="top",
                     fontsize=9, color=self.COLOURS["text"])  # fmt: skip
        return self._add(name, _Node(x, y, w, h))

    def op(
        self, name: str, x: float, y: float, text: str | None = None, width: float | None = None
    ) -> str:
        """An operation (a matrix product, a softmax, a norm ...) as a rounded box at ``(x, y)``; its
        width fits the text unless ``width`` is given."""
        text = text or name
        lines = text.split("\n")
        width = width or 0.16 * max(len(line) for line in lines) + 0.4
        h = 0.35 + 0.3 * len(lines)
        self.ax.add_patch(
            FancyBboxPatch(
                (x - width / 2, y - h / 2), width, h, boxstyle="round,pad=0.05",
                facecolor=self.COLOURS["op"], edgecolor=self.COLOURS["edge"], lw=1.2, zorder=2,
            )
        )  # fmt: skip
        self.ax.text(x, y, text, ha="center", va="center", fontsize=9,
                     color=self.COLOURS["text"], zorder=3)  # fmt: skip
        return self._add(name, _Node(x, y, width, h))

    def arrow(self, start: str, end: str, text: str | None = None, bend: float = 0.0) -> None:
        """An arrow from node ``start`` to node ``end`` (``bend`` curves it; ``text`` labels it)."""
        for n in (start, end):
            if n not in self.nodes:
                raise KeyError(f"no node named {n!r}; draw it before connecting it")
        a, b = self.nodes[start], self.nodes[end]
        self.ax.add_patch(
            FancyArrowPatch(
                self._edge(a, b), self._edge(b, a), arrowstyle="-|>", mutation_scale=12, lw=1.2,
                color=self.COLOURS["edge"], connectionstyle=f"arc3,rad={bend}", zorder=1,
            )
        )  # fmt: skip
        if text:
            self.ax.text((a.x + b.x) / 2, (a.y + b.y) / 2 + 0.12, text, ha="center", va="bottom",
                         fontsize=8, color=self.COLOURS["edge"])  # fmt: skip

    @staticmethod
    def _edge(node: _Node, other: _Node, gap: float = 0.08) -> tuple[float, float]:
        """Where the straight line from ``node``'s centre towards ``other`` leaves ``node``."""
        dx, dy = other.x - node.x, other.y - node.y
        if dx == dy == 0:
            return node.x, node.y
        t = min(
            (node.w / 2 + gap) / abs(dx) if dx else float("inf"),
            (node.h / 2 + gap) / abs(dy) if dy else float("inf"),
        )
        return node.x + t * dx, node.y + t * dy

    def finish(self, title: str | None = None) -> Figure:
        """Fit the view to what was drawn, set the title and return the figure."""
        if not self.nodes:
            raise ValueError("nothing was drawn")
        xs = [n.x - n.w / 2 for n in self.nodes.values()] + [
            n.x + n.w / 2 for n in self.nodes.values()
        ]
        ys = [n.y - n.h / 2 for n in self.nodes.values()] + [
            n.y + n.h / 2 for n in self.nodes.values()
        ]
        self.ax.set_xlim(min(xs) - 0.5, max(xs) + 0.5)
        self.ax.set_ylim(min(ys) - 0.5, max(ys) + 0.5)
        if title:
            self.ax.set_title(title, fontsize=10)
        return self.fig


_TEX_WORDS = {"\\sqrt": "√", "\\times": "×", "\\theta": "θ", "\\eta": "η", "\\tau": "τ",
              "\\alpha": "α", "\\|": "‖", "\\top": "ᵀ", "\\ell": "ℓ", "\\infty": "∞",
              "\\leq": "≤", "\\geq": "≥", "\\propto": "∝"}  # fmt: skip


def _clean(text: str) -> str:
    """Matplotlib's mathtext written for reading: ``$\\sqrt{d_k}$`` becomes ``√d_k``."""
    text = re.sub(r"\\(mathrm|mathbf|mathcal|text|operatorname)\{([^}]*)\}", r"\2", text)
    for tex, plain in _TEX_WORDS.items():
        text = text.replace(tex, plain)
    text = text.replace("$", "").replace("{", "").replace("}", "").replace("^ᵀ", "ᵀ")
    return re.sub(r"\s+", " ", text).strip()


def _categories(ax) -> list[str]:
    """The names along the x axis when it holds categories (words given to its ticks, or strings
    plotted), else nothing."""
    from matplotlib.ticker import LogFormatter, ScalarFormatter

    if isinstance(ax.xaxis.get_major_formatter(), ScalarFormatter | LogFormatter):
        return []  # a numeric axis
    names = [_clean(t.get_text()) for t in ax.get_xticklabels() if t.get_text().strip()]
    return names if names and not any(map(_is_number, names)) else []


def _is_number(text: str) -> bool:
    try:
        float(text.replace("\u2212", "-"))  # matplotlib writes a minus sign, not a hyphen
    except ValueError:
        return False
    return True


def _x_range(ax) -> tuple[float, float] | None:
    """The smallest and largest x of what is plotted (curves, points, bars), not the axis's margins."""
    xs = [np.asarray(line.get_xdata(), dtype=float).ravel() for line in ax.lines]
    xs += [np.asarray(c.get_offsets(), dtype=float)[:, 0] for c in ax.collections]
    xs += [
        np.array([p.get_x(), p.get_x() + p.get_width()]) for p in ax.patches if hasattr(p, "get_x")
    ]
    drawn = np.concatenate(xs) if xs else np.array([])
    finite = drawn[np.isfinite(drawn)]
    return (float(finite.min()), float(finite.max())) if finite.size else None


def describe(fig: Figure) -> str:
    """One paragraph that says what a figure shows, read from the figure itself: its title, and for each
    panel its title, what is plotted against what (with the range of the x values drawn), the names of
    its curves or bars, and its heat maps with what their rows and columns are. The book uses it as the
    figure's alt text."""
    parts = []
    title = fig._suptitle.get_text() if fig._suptitle is not None else ""
    if title:
        parts.append(_clean(title) + ".")
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.has_data()]
    for i, ax in enumerate(panels, start=1):
        name = _clean(ax.get_title())
        what = []
        xlabel, ylabel = _clean(ax.get_xlabel()), _clean(ax.get_ylabel())
        if ax.images:
            rows, cols = ax.images[0].get_array().shape[:2]
            axes_named = f" (rows: {ylabel}; columns: {xlabel})" if xlabel and ylabel else ""
            what.append(f"a {rows} by {cols} heat map{axes_named}")
        elif ax.lines or ax.collections or ax.patches:
            span = _x_range(ax)
            if xlabel and ylabel:
                shown = f" (from {span[0]:.3g} to {span[1]:.3g})" if span else ""
                what.append(f"{ylabel} against {xlabel}{shown}")
            elif ylabel or xlabel:
                what.append(ylabel or xlabel)
            categories = _categories(ax)
            if categories:
                what.append(
                    ("bars for " if ax.patches and not ax.lines else "for ") + ", ".join(categories)
                )
        legend = ax.get_legend()
        if legend is not None:
            names = [_clean(t.get_text()) for t in legend.get_texts() if t.get_text()]
            if names:
                what.append("showing " + "; ".join(names))
        text = ", ".join(what)
        if text and not name and len(panels) > 1:
            name = f"Panel {i}"
        if name or text:
            parts.append(f"{name}: {text}." if name and text else f"{name or text}.")
    return " ".join(parts) or "A figure."


def _describing_print_png(print_png):
    """Wrap matplotlib's PNG writer so that a PNG without a ``Description`` gets :func:`describe`'s."""

    @functools.wraps(print_png)
    def wrapper(self, *args, metadata=None, **kwargs):
        metadata = dict(metadata or {})
        if "Description" not in metadata:
            try:
                metadata["Description"] = describe(self.figure)
            except Exception:  # a description must never stop a figure from being drawn
                pass
        return print_png(self, *args, metadata=metadata, **kwargs)

    wrapper.describes = True
    return wrapper


if not getattr(FigureCanvasAgg.print_png, "describes", False):
    # Every PNG matplotlib writes while the package is imported (a page's figures, a lab's) carries a
    # description of the figure in its Description field; the book's extension makes it the alt text.
    FigureCanvasAgg.print_png = _describing_print_png(FigureCanvasAgg.print_png)
