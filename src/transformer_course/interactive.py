"""Figures a reader moves: the data computed by the package when a page executes, drawn in the browser.

Shared infrastructure of the chapters, like :mod:`plots`. A figure is a few controls (sliders and menus)
and, for every combination of their values, a :class:`Frame`: the panels to draw (:func:`lines`,
:func:`heatmap`, :func:`bars`) and one sentence that says what the frame shows. Python computes every
frame from the package's tested functions when the page executes, so the figure shows the course's own
numbers; the site's script ``_static/course-figures.js`` (no library, no network) draws the chosen frame
as SVG, and the sentence is read out to screen readers when a control moves. The same data draws the
static fallback with matplotlib: the initial frame as an image whose alt text is the figure's title and
the frame's sentence, shown in print, in Jupyter and Colab, and to readers without JavaScript.

A figure whose frames are too many to list (the KV-cache calculator: six controls) names a function of
the script instead (``compute``); its initial frame still comes from Python, and the site tests compare
the script's numbers with the package's function at many settings.
"""

from __future__ import annotations

import base64
import html
import io
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import matplotlib.pyplot as plt
import torch

__all__ = ["Control", "Frame", "InteractiveFigure", "bars", "heatmap", "lines", "series"]

# Okabe-Ito: distinguishable with the common colour-vision deficiencies; the script uses the same list
PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]


def _numbers(values) -> list:
    """Plain floats (rounded to 5 significant digits: the page stays small) from a tensor or a list."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().double().tolist()
    out = []
    for v in values:
        if isinstance(v, list | tuple):
            out.append(_numbers(v))
        else:
            v = float(v)
            if not math.isfinite(v):
                raise ValueError(f"a figure's values must be finite, got {v}")
            out.append(float(f"{v:.5g}"))
    return out


@dataclass(frozen=True)
class Control:
    """A slider (``kind="range"``) or a menu (``kind="select"``) over ``values``.

    ``labels`` are what the reader sees for each value (default: the values themselves); ``initial`` is
    the index of the value the figure opens with. A ``reveal`` slider draws more or fewer points of the
    series that name it in ``upto`` (a trajectory that grows step by step); it does not choose a frame,
    and the frame's ``summary`` is then a list with one sentence per value of the slider.
    """

    name: str
    label: str
    values: Sequence[Any]
    labels: Sequence[str] | None = None
    initial: int = 0
    kind: str = "range"
    reveal: bool = False

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name):
            raise ValueError(f"control name {self.name!r}: use lower-case letters, digits and _")
        if self.kind not in ("range", "select"):
            raise ValueError(f"control {self.name!r}: kind must be 'range' or 'select'")
        if not self.values:
            raise ValueError(f"control {self.name!r} has no values")
        if self.labels is not None and len(self.labels) != len(self.values):
            raise ValueError(
                f"control {self.name!r}: {len(self.labels)} labels for {len(self.values)} values"
            )
        if not 0 <= self.initial < len(self.values):
            raise ValueError(f"control {self.name!r}: initial index {self.initial} out of range")
        if self.reveal and self.kind != "range":
            raise ValueError(f"control {self.name!r}: only a slider can reveal points")

    def spec(self) -> dict:
        labels = self.labels if self.labels is not None else [str(v) for v in self.values]
        return {
            "name": self.name,
            "label": self.label,
            "kind": self.kind,
            "values": list(self.values),
            "labels": list(labels),
            "initial": self.initial,
            "reveal": self.reveal,
        }


def series(
    name: str, x, y, *, style: str = "line", dashed: bool = False, upto: str | None = None
) -> dict:
    """One curve of a :func:`lines` panel; ``style`` is ``line``, ``points`` or ``both``. With ``upto``
    the name of a control, only the first ``value`` points are drawn (a trajectory that grows)."""
    x, y = _numbers(x), _numbers(y)
    if len(x) != len(y):
        raise ValueError(f"series {name!r}: {len(x)} x values for {len(y)} y values")
    if style not in ("line", "points", "both"):
        raise ValueError(f"series {name!r}: style must be 'line', 'points' or 'both'")
    out = {"name": name, "x": x, "y": y, "style": style}
    if dashed:
        out["dashed"] = True
    if upto:
        out["upto"] = upto
    return out


def lines(
    curves: Sequence[dict],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xlog: bool = False,
    ylog: bool = False,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    square: bool = False,
) -> dict:
    """A panel of curves (from :func:`series`) on linear or log axes. Fixed ``xlim``/``ylim`` keep the
    axes still while a control moves, so what changes is the data."""
    for name, log, lim in (("x", xlog, xlim), ("y", ylog, ylim)):
        if log and lim is not None and min(lim) <= 0:
            raise ValueError(f"a log {name} axis needs positive limits, got {lim}")
    panel = {
        "type": "lines",
        "title": title,
        "xlabel": xlabel,
        "ylabel": ylabel,
        "series": list(curves),
        "xlog": xlog,
        "ylog": ylog,
        "square": square,
    }
    if xlim is not None:
        panel["xlim"] = _numbers(xlim)
    if ylim is not None:
        panel["ylim"] = _numbers(ylim)
    return panel


def heatmap(
    z,
    *,
    title: str,
    xlabels: Sequence[str],
    ylabels: Sequence[str],
    xlabel: str = "key m",
    ylabel: str = "query n",
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> dict:
    """A matrix drawn as coloured cells (viridis from ``vmin`` to ``vmax``), rows top to bottom."""
    z = _numbers(z)
    if not z or any(len(row) != len(xlabels) for row in z) or len(z) != len(ylabels):
        raise ValueError(
            f"heatmap {title!r}: {len(z)} rows for {len(ylabels)} row labels and "
            f"{len(xlabels)} column labels"
        )
    return {
        "type": "heatmap",
        "title": title,
        "z": z,
        "xlabels": list(xlabels),
        "ylabels": list(ylabels),
        "xlabel": xlabel,
        "ylabel": ylabel,
        "vmin": vmin,
        "vmax": vmax,
    }


def bars(
    labels: Sequence[str], values, *, title: str, ylabel: str, ymax: float | None = None
) -> dict:
    """Vertical bars, one per label."""
    values = _numbers(values)
    if len(values) != len(labels):
        raise ValueError(f"bars {title!r}: {len(labels)} labels for {len(values)} values")
    out = {
        "type": "bars",
        "title": title,
        "labels": list(labels),
        "values": values,
        "ylabel": ylabel,
    }
    if ymax is not None:
        out["ymax"] = float(ymax)
    return out


@dataclass
class Frame:
    """What the figure draws at one setting of its controls: panels and one sentence about them (the
    sentence is shown under the panels, read out when a control moves, and is part of the alt text)."""

    panels: list[dict]
    summary: str | list[str]
    extra: dict = field(default_factory=dict)

    def spec(self) -> dict:
        return {"panels": self.panels, "summary": self.summary, **self.extra}


class InteractiveFigure:
    """A figure with controls; ``frame(**values)`` returns the :class:`Frame` for one setting.

    Args:
        name: a page-unique id (letters, digits, ``-``).
        title: what the figure shows, the start of its alt text.
        controls: the sliders and menus.
        frame: called with one keyword per control (its value) for every combination of values, or for
            the initial one only when ``compute`` is given.
        compute: the name of a function of ``course-figures.js`` that computes frames in the browser
            (for figures with too many combinations to list); the site tests check it against Python.
        data: extra data the ``compute`` function reads (e.g. measured values to compare with).
    """

    def __init__(
        self,
        name: str,
        title: str,
        controls: Sequence[Control],
        frame: Callable[..., Frame],
        *,
        compute: str | None = None,
        data: dict | None = None,
    ) -> None:
        if not re.fullmatch(r"[a-z][a-z0-9-]*", name):
            raise ValueError(f"figure name {name!r}: use lower-case letters, digits and -")
        names = [c.name for c in controls]
        if len(set(names)) != len(names):
            raise ValueError(f"figure {name!r}: two controls share a name in {names}")
        self.name, self.title, self.controls = name, title, list(controls)
        reveal = [c for c in self.controls if c.reveal]
        if len(reveal) > 1:
            raise ValueError(f"figure {name!r}: at most one control reveals points")
        self.reveal = reveal[0] if reveal else None
        self.compute, self.data = compute, data or {}
        chooses = [c for c in self.controls if not c.reveal]  # the controls that pick a frame
        self.initial = self._checked(frame(**{c.name: c.values[c.initial] for c in chooses}))
        self.frames: dict[str, dict] = {}
        if compute is None:
            for index in itertools.product(*(range(len(c.values)) for c in chooses)):
                values = {c.name: c.values[i] for c, i in zip(chooses, index, strict=True)}
                self.frames["|".join(map(str, index))] = self._checked(frame(**values)).spec()

    def _checked(self, f: Frame) -> Frame:
        want = len(self.reveal.values) if self.reveal else None
        got = len(f.summary) if isinstance(f.summary, list) else None
        if want != got:
            raise ValueError(
                f"figure {self.name!r}: a frame's summary must be "
                + (
                    f"a list of {want} sentences (one per value of the slider {self.reveal.name!r})"
                    if want
                    else "one sentence"
                )
            )
        return f

    @property
    def initial_summary(self) -> str:
        s = self.initial.summary
        return s[self.reveal.initial] if self.reveal else s

    @property
    def alt(self) -> str:
        """The alt text: the title and what the initial frame shows."""
        return f"{self.title}. {self.initial_summary}"

    def spec(self) -> dict:
        spec = {
            "name": self.name,
            "title": self.title,
            "controls": [c.spec() for c in self.controls],
            "initial": self.initial.spec(),
        }
        if self.compute:
            spec["compute"], spec["data"] = self.compute, self.data
        else:
            spec["frames"] = self.frames
        return spec

    def static_figure(self):
        """The initial frame drawn with matplotlib (the fallback for print and for no JavaScript)."""
        panels = self.initial.panels
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 3.6), squeeze=False)
        fig.set_facecolor("white")
        for ax, panel in zip(axes[0], panels, strict=True):
            _draw_static(ax, panel, {c.name: c.values[c.initial] for c in self.controls})
        fig.suptitle(self.title, fontsize=10)
        fig.tight_layout()
        return fig

    def _png(self) -> str:
        fig = self.static_figure()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=80)
        plt.close(fig)
        return base64.b64encode(buffer.getvalue()).decode()

    def to_html(self) -> str:
        """The figure's HTML: the data as JSON, an empty place for the script to draw in, and the static
        image (with alt text) that stays when the script does not run."""
        data = json.dumps(self.spec(), separators=(",", ":")).replace("</", "<\\/")
        return (
            f'<figure class="tc-fig" id="tc-fig-{self.name}" data-tc-figure>'
            f'<script type="application/json" class="tc-fig-data">{data}</script>'
            f'<img class="tc-fig-static" src="data:image/png;base64,{self._png()}" '
            f'alt="{html.escape(self.alt)}">'
            f'<div class="tc-fig-live" hidden></div>'
            f"<figcaption>{html.escape(self.title)}</figcaption></figure>"
        )

    _repr_html_ = to_html


def _draw_static(ax, panel: dict, values: dict) -> None:
    kind = panel["type"]
    ax.set_title(panel["title"], fontsize=9)
    if kind == "lines":
        for i, s in enumerate(panel["series"]):
            n = int(values[s["upto"]]) if "upto" in s else len(s["x"])
            x, y = s["x"][:n], s["y"][:n]
            style = {"line": "-", "points": "o", "both": "o-"}[s["style"]]
            if s.get("dashed"):
                style = style.replace("-", "--")
            ax.plot(x, y, style, color=PALETTE[i % len(PALETTE)], label=s["name"], ms=3)
        ax.set_xscale("log" if panel["xlog"] else "linear")
        ax.set_yscale("log" if panel["ylog"] else "linear")
        if "xlim" in panel:
            ax.set_xlim(*panel["xlim"])
        if "ylim" in panel:
            ax.set_ylim(*panel["ylim"])
        if panel.get("square"):
            ax.set_aspect("equal", adjustable="box")
        if len(panel["series"]) > 1:
            ax.legend(fontsize=7)
    elif kind == "heatmap":
        ax.imshow(panel["z"], cmap="viridis", vmin=panel["vmin"], vmax=panel["vmax"], aspect="auto")
        ax.set_xticks(range(len(panel["xlabels"])), panel["xlabels"], fontsize=6)
        ax.set_yticks(range(len(panel["ylabels"])), panel["ylabels"], fontsize=6)
    elif kind == "bars":
        ax.bar(range(len(panel["values"])), panel["values"], color=PALETTE[0])
        ax.set_xticks(range(len(panel["labels"])), panel["labels"], fontsize=7)
        if "ymax" in panel:
            ax.set_ylim(0, panel["ymax"])
    else:
        raise ValueError(f"unknown panel type {kind!r}")
    ax.set_xlabel(panel.get("xlabel", ""), fontsize=8)
    ax.set_ylabel(panel.get("ylabel", ""), fontsize=8)
