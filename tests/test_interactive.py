"""The interactive figures: their data (tc.interactive), the chapters' figures (tc.figures), and the
package functions they draw. The browser side is tested in tests/test_site.py."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch

import transformer_course as tc
from transformer_course import figures
from transformer_course.interactive import Control, Frame, InteractiveFigure, bars, lines, series


def _spec(fig: InteractiveFigure) -> dict:
    html = fig.to_html()
    data = re.search(r'<script type="application/json" class="tc-fig-data">(.*?)</script>', html)
    return json.loads(data.group(1).replace("<\\/", "</"))


def _toy(**kwargs) -> InteractiveFigure:
    def frame(a, b):
        return Frame([bars(["x", "y"], [a, b], title=f"{a} {b}", ylabel="v")], f"a = {a}, b = {b}")

    return InteractiveFigure(
        "toy", "A toy", [Control("a", "a", [1, 2, 3]), Control("b", "b", [5, 6], kind="select")],
        frame, **kwargs,
    )  # fmt: skip


def test_every_combination_of_the_controls_has_its_frame():
    spec = _spec(_toy())
    assert sorted(spec["frames"]) == [f"{i}|{j}" for i in range(3) for j in range(2)]
    assert spec["frames"]["2|1"]["summary"] == "a = 3, b = 6"
    assert spec["frames"]["1|0"]["panels"][0]["values"] == [2.0, 5.0]


def test_the_static_fallback_carries_alt_text_from_the_initial_frame():
    html = _toy().to_html()
    assert 'alt="A toy. a = 1, b = 5"' in html
    assert 'class="tc-fig-static" src="data:image/png;base64,' in html
    assert '<div class="tc-fig-live" hidden></div>' in html


def test_a_closing_script_tag_in_the_data_cannot_end_the_script():
    def frame(a):
        return Frame([bars(["</script>"], [a], title="t", ylabel="v")], "</script><b>")

    html = InteractiveFigure("esc", "t", [Control("a", "a", [1])], frame).to_html()
    body = html.split('class="tc-fig-data">', 1)[1].split("</script>", 1)[0]
    assert "</" not in body and json.loads(body.replace("<\\/", "</"))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Control("A b", "x", [1]), "lower-case"),
        (lambda: Control("a", "x", []), "no values"),
        (lambda: Control("a", "x", [1, 2], labels=["one"]), "1 labels for 2 values"),
        (lambda: Control("a", "x", [1], initial=3), "out of range"),
        (lambda: Control("a", "x", [1], kind="select", reveal=True), "only a slider"),
        (lambda: series("s", [1, 2], [1]), "2 x values for 1 y values"),
        (lambda: series("s", [1], [float("nan")]), "finite"),
        (lambda: lines([], title="t", xlabel="x", ylabel="y", xlog=True, xlim=(0, 1)), "positive"),
        (lambda: bars(["a"], [1, 2], title="t", ylabel="y"), "1 labels for 2 values"),
    ],
)
def test_bad_figure_data_is_refused_with_the_reason(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_reveal_slider_needs_one_sentence_per_value():
    controls = [Control("w", "w", [1, 2]), Control("s", "s", [1, 2, 3], reveal=True)]

    def good(w):
        return Frame([lines([series("p", [0, 1, 2], [0, w, 2 * w], upto="s")], title="t",
                            xlabel="x", ylabel="y")], [f"{w} {s}" for s in (1, 2, 3)])  # fmt: skip

    spec = _spec(InteractiveFigure("rev", "t", controls, good))
    assert sorted(spec["frames"]) == ["0", "1"]  # the reveal slider picks no frame
    with pytest.raises(ValueError, match="a list of 3 sentences"):
        InteractiveFigure("rev", "t", controls, lambda w: Frame([], "one sentence"))


def test_softmax_jacobian_is_autograd_of_the_softmax():
    z = torch.randn(3, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    a = torch.softmax(z, -1)
    J = torch.stack(
        [torch.autograd.functional.jacobian(lambda v: torch.softmax(v, -1), r) for r in z]
    )
    torch.testing.assert_close(tc.self_attention.softmax_jacobian(a), J, atol=1e-14, rtol=0)
    assert not torch.allclose(torch.diag_embed(a), J)  # the normaliser's term matters


def test_saturation_sharpens_without_the_scale_and_not_with_it():
    d_ks = [1, 16, 256]
    scaled = tc.self_attention.saturation(d_ks, M=8, draws=200, scaled=True)
    unscaled = tc.self_attention.saturation(d_ks, M=8, draws=200, scaled=False)
    assert torch.allclose(scaled["sorted"].sum(-1), torch.ones(3))
    assert (scaled["max"] / scaled["max"][0] - 1).abs().max() < 0.25  # M = 8, 200 draws
    assert unscaled["max"][-1] > 0.8 and unscaled["jacobian"][-1] < 0.5 * unscaled["jacobian"][0]
    assert torch.equal(scaled["max"][:1], unscaled["max"][:1])  # d_k = 1: the scale is 1


def test_next_token_probs_is_the_tempered_truncated_softmax():
    z = torch.tensor([[2.0, 1.0, 0.5, -1.0, 0.0]])
    for tau, k in [(1.0, None), (0.5, 2), (2.0, 4), (0.7, 1)]:
        zz = z[0].double().numpy() / tau
        keep = zz >= np.sort(zz)[-k] if k else np.ones_like(zz, dtype=bool)
        e = np.where(keep, np.exp(zz - zz.max()), 0.0)
        got = tc.language_models.next_token_probs(z, tau, k)[0].double().numpy()
        np.testing.assert_allclose(got, e / e.sum(), atol=1e-7)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        tc.language_models.next_token_probs(z, 0.0)


def test_the_chapters_figures_are_built_from_the_package():
    scale = figures.attention_scale(M=8, draws=50)
    assert len(scale.frames) == 20 and "d_k = 64" in scale.alt
    pos = _spec(figures.position_similarity(D=16, offsets=8))
    rope = [v for k, v in pos["frames"].items() if k.startswith("1|1|")]  # RoPE after projections
    sin = [v for k, v in pos["frames"].items() if k.startswith("0|1|")]
    assert all("offset alone" in f["summary"] for f in rope)
    assert any("depends on where the pair sits" in f["summary"] for f in sin)
    adam = _spec(figures.schedule_and_adamw(warmups=(0, 5), steps=20))
    first = adam["frames"]["0"]["summary"][1]  # no warm-up, after one update: eta_1 = 0.1
    assert "η_1 = 0.1" in first and "AdamW at (1.90, 0.90)" in first


def test_the_kv_cache_calculator_starts_at_a_measured_cache():
    measured = [dict(layers=2, heads=4, kv_heads=1, d_head=32, context=64, batch=1,
                     dtype="float32", bytes=32768)]  # fmt: skip
    fig = figures.kv_cache_calculator(measured)
    spec = _spec(fig)
    assert spec["compute"] == "kv_cache" and "frames" not in spec
    assert spec["initial"]["bytes"] == tc.extensions.kv_cache_bytes(2, 1, 1, 64, 32) == 32768
    assert spec["data"]["bytes_per_number"] == {"float32": 4, "bfloat16": 2, "float16": 2}


def test_the_scaling_figure_predicts_the_held_out_size():
    runs = [
        dict(steps=100, params=n, val_loss=3.0 * n**-0.3 + 1.0) for n in (1e3, 3e3, 1e4, 3e4, 1e5)
    ]
    spec = _spec(figures.scaling_fits({"runs": runs, "machine": "test"}))
    summary = spec["frames"]["0|2"]["summary"]  # the largest size held out: an exact power law
    predicted, measured = map(
        float, re.search(r"predicts ([\d.]+) .* measured ([\d.]+)", summary).groups()
    )
    assert math.isclose(predicted, measured, abs_tol=2e-3)
    with pytest.raises(ValueError, match="the study recorded"):
        figures.scaling_fits({"runs": runs}, budgets=[50])
