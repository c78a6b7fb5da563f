"""Figures: the heat map draws the numbers it is given, with the right scale, and explains bad input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch

from transformer_course import plots
from transformer_course.plots import attention_heatmap


def test_heatmap_draws_the_matrix_with_labels_and_annotations():
    A = torch.softmax(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)), dim=-1)
    fig = attention_heatmap(A, queries=["a", "b", "c"], keys=list("wxyz"), title="t")
    ax = fig.axes[0]
    image = ax.images[0]
    np.testing.assert_allclose(image.get_array(), A.numpy())
    assert image.get_clim() == (0.0, 1.0) and image.get_cmap().name == "viridis"
    assert [t.get_text() for t in ax.get_xticklabels()] == list("wxyz")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    assert len(ax.texts) == 12 and ax.texts[0].get_text() == f"{A[0, 0]:.2f}"
    assert ax.get_title() == "t"
    plt.close(fig)


def test_negative_entries_get_a_diverging_scale_centred_on_zero():
    K = torch.tensor([[-2.0, 0.5], [1.0, 0.0]])  # a filter, not attention weights
    fig = attention_heatmap(K, vmax=None)
    image = fig.axes[0].images[0]
    assert image.get_cmap().name == "RdBu_r" and image.get_clim() == (-2.0, 2.0)
    plt.close(fig)


def test_large_matrices_are_not_annotated_and_draw_into_a_given_axes():
    fig, ax = plt.subplots()
    out = attention_heatmap(torch.rand(20, 20), ax=ax)
    assert out is fig and len(ax.texts) == 0
    plt.close(fig)


def test_bad_input_is_explained():
    with pytest.raises(ValueError, match=r"2-D \(queries x keys\)"):
        attention_heatmap(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="2 query labels for 3 rows"):
        attention_heatmap(torch.rand(3, 3), queries=["a", "b"])
    with pytest.raises(ValueError, match="1 key labels for 3 columns"):
        attention_heatmap(torch.rand(3, 3), keys=["a"])


def test_diagram_draws_tensors_to_their_shape_and_connects_box_edges():
    from matplotlib.patches import FancyArrowPatch, Rectangle

    from transformer_course.plots import Diagram

    d = Diagram(unit=0.5)
    d.tensor("X", torch.zeros(2, 6, 8), 0, 0)  # a batch: the last two dims are drawn
    d.op("proj", 5, 0, "X W")
    d.tensor("Q", (6, 4), 9, 0)
    d.arrow("X", "proj")
    d.arrow("proj", "Q", text="Q")
    fig = d.finish("t")
    rects = [p for p in d.ax.patches if isinstance(p, Rectangle) and p.get_width() != 1]
    assert sorted((r.get_width(), r.get_height()) for r in rects)[:2] == [(2.0, 3.0), (4.0, 3.0)]
    labels = [t.get_text() for t in d.ax.texts]
    assert "X\n(2 x 6 x 8)" in labels and "Q\n(6 x 4)" in labels and "X W" in labels
    arrow = next(p for p in d.ax.patches if isinstance(p, FancyArrowPatch))
    (x0, _), (x1, _) = arrow._posA_posB  # starts at X's right edge, ends at the box's left edge
    assert x0 == pytest.approx(2.0 + 0.08) and x1 < 5 - 0.3
    assert fig.get_facecolor()[:3] == (1.0, 1.0, 1.0)  # its own white: readable in dark mode
    with pytest.raises(ValueError, match="already has a node named 'Q'"):
        d.tensor("Q", (1, 1), 0, 0)
    with pytest.raises(KeyError, match="no node named 'Y'"):
        d.arrow("Q", "Y")
    plt.close(fig)


def test_describe_reads_what_a_figure_shows_and_every_png_carries_it():
    """The alt text of the book's figures: titles, what is plotted against what, the curves' names,
    heat maps; written into the PNG's Description field whenever matplotlib draws one."""
    import io

    from PIL import Image

    fig, axes = plt.subplots(1, 2)
    axes[0].loglog([1, 2, 4], [1, 2, 4], label=r"Var$(q^\top k/\sqrt{d_k})$")
    axes[0].set(xlabel="$d_k$", ylabel="variance", title="Variance of a dot product")
    axes[0].legend()
    axes[1].imshow(torch.eye(3).numpy())
    axes[1].set_title("weights")
    fig.suptitle("Two panels")
    text = plots.describe(fig)
    assert text.startswith("Two panels. Variance of a dot product: variance against d_k (from ")
    assert "showing Var(qᵀ k/√d_k)" in text and "weights: a 3 by 3 heat map." in text
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    buffer.seek(0)
    assert Image.open(buffer).text["Description"] == text
    empty = plt.figure()
    assert plots.describe(empty) == "A figure."
    plt.close(empty)


def test_describe_gives_the_range_drawn_the_heat_maps_axes_and_the_bars_names():
    """The x range is that of the data (not the axis with its margins); a heat map says what its rows
    and columns are; bars over categories are named."""
    fig, axes = plt.subplots(1, 4)
    axes[0].plot([0, 1, 2, 199], [4.0, 3.0, 2.5, 2.0])
    axes[0].set(xlabel="step", ylabel="loss")
    axes[1].imshow(torch.eye(4).numpy())
    axes[1].set(xlabel="predicted", ylabel="true")
    axes[2].bar(["pre-norm", "post-norm"], [1.5, 1.7])
    axes[2].set(ylabel="validation loss")
    axes[3].plot([0, 1], [2.0, 2.1], "o-")
    axes[3].set_xticks([0, 1], ["separate", "tied"])
    axes[3].set(ylabel="val loss", yscale="log")
    text = plots.describe(fig)
    plt.close(fig)
    assert "Panel 1: loss against step (from 0 to 199)." in text, text
    assert "Panel 2: a 4 by 4 heat map (rows: true; columns: predicted)." in text, text
    assert "Panel 3: validation loss, bars for pre-norm, post-norm." in text, text
    assert "Panel 4: val loss, for separate, tied." in text, text
