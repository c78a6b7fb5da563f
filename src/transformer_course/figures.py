"""The interactive figures of the chapters: each function computes a figure's frames from the package's
tested functions (and, where a page trained a model or a benchmark measured runs, from those) and
returns an :class:`.interactive.InteractiveFigure` for the page to display.

* :func:`attention_scale` (*Self-attention*): the key width and the scale; weights and the softmax's
  Jacobian.
* :func:`attention_heads` and :func:`sampling` (*Language models*): the trained GPT's attention maps by
  block and head; temperature and top-k on its next-character distribution.
* :func:`position_similarity` and :func:`kv_cache_calculator` (*Extensions*): sinusoids and RoPE against
  the offset, before and after the projections; the size of a key-value cache.
* :func:`schedule_and_adamw` and :func:`scaling_fits` (*Training*): warm-up and cosine decay with
  AdamW's first steps; the scaling runs, their fit and the held-out predictions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from . import extensions, language_models, position, self_attention, train
from .interactive import Control, Frame, InteractiveFigure, bars, heatmap, lines, series
from .training import optim, scaling

__all__ = [
    "attention_heads",
    "attention_scale",
    "kv_cache_calculator",
    "position_similarity",
    "sampling",
    "scaling_fits",
    "schedule_and_adamw",
]


def _show(c: str) -> str:
    return {"\n": "⏎", " ": "␣"}.get(c, c)


def attention_scale(M: int = 16, draws: int = 400) -> InteractiveFigure:
    """Weights of one query over ``M`` random keys as ``d_k`` grows, with and without ``1/sqrt(d_k)``
    (:func:`.self_attention.saturation`)."""
    d_ks = [2**p for p in range(10)]
    stats = {s: self_attention.saturation(d_ks, M, draws, scaled=s) for s in (True, False)}
    top = 1.1 * float(max(stats[True]["jacobian"].max(), stats[False]["jacobian"].max()))

    def frame(d_k: int, scaled: bool) -> Frame:
        i, st = d_ks.index(d_k), stats[scaled]
        name = "scaled by 1/√d_k" if scaled else "not scaled"
        return Frame(
            [
                bars(
                    [str(r) for r in range(1, M + 1)],
                    st["sorted"][i],
                    ymax=1.0,
                    title=f"Mean weights, largest first (d_k = {d_k})",
                    ylabel="weight",
                ),
                lines(
                    [
                        series("scaled", d_ks, stats[True]["jacobian"], style="both"),
                        series(
                            "not scaled", d_ks, stats[False]["jacobian"], style="both", dashed=True
                        ),
                        series(f"d_k = {d_k}, {name}", [d_k], [st["jacobian"][i]], style="points"),
                    ],
                    title="Norm of the softmax's Jacobian",
                    xlabel="key width d_k",
                    ylabel="mean ‖J‖_F",
                    xlog=True,
                    ylim=(0.0, top),
                ),
            ],
            f"d_k = {d_k}, {name}: the largest of the {M} weights averages "
            f"{float(st['max'][i]):.2f}, their entropy {float(st['entropy'][i]):.2f} nats (uniform: "
            f"ln {M} = {math.log(M):.2f}) and the Jacobian's norm {float(st['jacobian'][i]):.3f}.",
        )

    return InteractiveFigure(
        "attention-scale",
        f"Softmax over {M} keys as the key width grows, with and without the scale ({draws} queries)",
        [
            Control("d_k", "key width d_k", d_ks, initial=6),
            Control(
                "scaled", "scores", [True, False], ["scaled by 1/√d_k", "not scaled"], kind="select"
            ),
        ],
        frame,
    )


def attention_heads(model, tokenizer, line: str) -> InteractiveFigure:
    """The attention weights of every block and head of a trained :class:`.language_models.GPT` on
    ``line`` (:func:`.language_models.attention_maps`)."""
    device = next(model.parameters()).device
    ids = torch.tensor([tokenizer.encode(line)], device=device)
    maps = [A[0].cpu() for A in language_models.attention_maps(model, ids)]  # L x (H, N, N)
    labels = [_show(c) for c in line]
    space = torch.tensor([c in " \n" for c in line])
    L, H = len(maps), maps[0].shape[0]

    def frame(block: int, head: int) -> Frame:
        A = maps[block - 1][head - 1]  # (N, N)
        prev = float(A.diagonal(-1).mean())
        own = float(A.diagonal().mean())
        on_space = float((A[1:] * space).sum(-1).mean())
        return Frame(
            [heatmap(A, title=f"Block {block}, head {head}", xlabels=labels, ylabels=labels)],
            f"Block {block}, head {head}: on average a character puts {prev:.2f} of its weight on "
            f"the previous character, {own:.2f} on itself and {on_space:.2f} on spaces and line "
            f"breaks.",
        )

    best = max(range(H), key=lambda h: float(maps[0][h].diagonal(-1).mean()))
    return InteractiveFigure(
        "attention-heads",
        "Attention weights of the trained GPT on a line (rows: queries, columns: keys)",
        [
            Control("block", "block", list(range(1, L + 1))),
            Control("head", "head", list(range(1, H + 1)), initial=best),
        ],
        frame,
    )


def sampling(model, tokenizer, prompt: str, shown: int = 16) -> InteractiveFigure:
    """The trained model's next-character distribution after ``prompt`` under temperature and top-k
    (:func:`.language_models.next_token_probs`): the ``shown`` most likely characters."""
    device = next(model.parameters()).device
    with torch.no_grad():
        z = model(torch.tensor([tokenizer.encode(prompt)], device=device))[0][0, -1].cpu()
    order = z.argsort(descending=True)[:shown]
    chars = [_show(tokenizer.decode([int(i)])) for i in order]
    temperatures = [0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 4.0]
    top_ks = [1, 3, 5, 10, 20, 0]

    def frame(temperature: float, top_k: int) -> Frame:
        p = language_models.next_token_probs(z[None], temperature, top_k or None)[0]
        kept = int((p > 0).sum())
        entropy = float(-(p[p > 0] * p[p > 0].log2()).sum())
        k_name = f"top {top_k}" if top_k else "no top-k"
        return Frame(
            [
                bars(
                    chars,
                    p[order],
                    title=f"p(next character), τ = {temperature}, {k_name}",
                    ylabel="probability",
                    ymax=1.0,
                )
            ],
            f"τ = {temperature}, {k_name}: '{chars[0]}' gets p = {float(p[order[0]]):.2f}, "
            f"{kept} characters can be drawn, entropy {entropy:.2f} bits; the {shown} shown hold "
            f"{float(p[order].sum()):.2f} of the probability.",
        )

    return InteractiveFigure(
        "sampling",
        f"Next character after “{prompt.splitlines()[-1]}”: temperature and top-k reshape the distribution",
        [
            Control("temperature", "temperature τ", temperatures, initial=3),
            Control(
                "top_k",
                "top-k",
                top_ks,
                [str(k) if k else "all" for k in top_ks],
                initial=len(top_ks) - 1,
                kind="select",
            ),
        ],
        frame,
    )


def position_similarity(D: int = 64, offsets: int = 64, seed: int = 0) -> InteractiveFigure:
    """The score of a query at position ``n`` with a key ``k`` positions later, for the sinusoids
    (:func:`.position.sinusoidal_encoding`, added) and RoPE (:func:`.extensions.apply_rope`), on the
    raw vectors and after random projections ``W_q``, ``W_k`` (entries of variance ``1/D``)."""
    g = torch.Generator().manual_seed(seed)
    W_q = torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D)
    W_k = torch.randn(D, D, generator=g, dtype=torch.float64) / math.sqrt(D)
    x = torch.randn(D, generator=g, dtype=torch.float64)  # one token's vector, for RoPE
    starts = [0, 8, 32, 96]
    ks = list(range(offsets + 1))
    P = position.sinusoidal_encoding(max(starts) + offsets + 1, D, dtype=torch.float64)

    def curve(scheme: str, view: str, n: int) -> torch.Tensor:
        m = torch.arange(n, n + offsets + 1)
        if scheme == "sinusoids":
            q, k = P[n], P[m]  # (D,), (K, D)
            if view == "raw":
                return k @ q / (q @ q)  # = 1 at offset 0
            return (k @ W_k) @ (q @ W_q) / math.sqrt(D)
        if view == "raw":
            q = extensions.apply_rope(x[None], torch.tensor([n]))[0]
            k = extensions.apply_rope(x.expand(len(m), D), m)
            return k @ q / (x @ x)
        q = extensions.apply_rope((x @ W_q)[None], torch.tensor([n]))[0]
        k = extensions.apply_rope((x @ W_k).expand(len(m), D), m)
        return k @ q / math.sqrt(D)

    curves = {
        (s, v, n): curve(s, v, n)
        for s in ("sinusoids", "rope")
        for v in ("raw", "projected")
        for n in starts
    }
    names = {"sinusoids": "Sinusoids (added)", "rope": "RoPE (rotated)"}
    views = {"raw": "before the projections", "projected": "after W_q and W_k"}

    def frame(scheme: str, view: str, n: int) -> Frame:
        ys = [c for (s, v, _), c in curves.items() if (s, v) == (scheme, view)]
        lo, hi = float(min(c.min() for c in ys)), float(max(c.max() for c in ys))
        pad = 0.05 * (hi - lo)
        diff = float((curves[scheme, view, n] - curves[scheme, view, 0]).abs().max())
        same = diff < 1e-9
        return Frame(
            [
                lines(
                    [
                        series(f"query at n = {n}", ks, curves[scheme, view, n]),
                        series("query at n = 0", ks, curves[scheme, view, 0], dashed=True),
                    ],
                    title=f"{names[scheme]}, {views[view]}",
                    xlabel="offset m − n",
                    ylabel="cosine" if view == "raw" else "score q·k/√D",
                    ylim=(lo - pad, hi + pad),
                )
            ],
            f"{names[scheme]}, {views[view]}, query at n = {n}: "
            + (
                "the curve is the one at n = 0 (to 1e-9): the score depends on the offset alone."
                if same
                else f"the curve differs from the one at n = 0 by up to {diff:.2f}: the score "
                "depends on where the pair sits, not only on the offset."
            ),
        )

    return InteractiveFigure(
        "position-similarity",
        f"The score of a query with a key m − n positions later (D = {D})",
        [
            Control("scheme", "scheme", ["sinusoids", "rope"], list(names.values()), kind="select"),
            Control("view", "vectors", ["raw", "projected"], list(views.values()), kind="select"),
            Control("n", "query position n", starts),
        ],
        frame,
    )


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def kv_cache_calculator(measured: Sequence[dict] = ()) -> InteractiveFigure:
    """The size of a key-value cache (:func:`.extensions.kv_cache_bytes`) for a chosen model, computed
    in the browser (six controls are too many settings to list); ``measured`` caches (dicts with the
    controls' values and ``"bytes"``, measured on the page) are named when the controls match one."""
    controls = [
        Control("layers", "layers L", [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 80], initial=1),
        Control("heads", "query heads H", [1, 2, 4, 8, 16, 32, 64], initial=2),
        Control("kv_heads", "key-value heads H_kv", [1, 2, 4, 8, 16, 32, 64], initial=0),
        Control("d_head", "head width d_k", [16, 32, 64, 128, 256], initial=1),
        Control("context", "context C", [64, 256, 1024, 4096, 8192, 32768, 131072], initial=0),
        Control("batch", "batch B", [1, 2, 4, 8, 16, 32, 64], initial=0),
        Control("dtype", "dtype", list(DTYPES), kind="select"),
    ]
    contexts = [64, 256, 1024, 4096, 8192, 32768, 131072]

    def frame(layers, heads, kv_heads, d_head, context, batch, dtype) -> Frame:
        kv = min(kv_heads, heads)
        nbytes = extensions.kv_cache_bytes(layers, batch, kv, context, d_head, DTYPES[dtype])
        mib = [
            extensions.kv_cache_bytes(layers, batch, kv, c, d_head, DTYPES[dtype]) / 2**20
            for c in contexts
        ]
        return Frame(
            [
                lines(
                    [
                        series(f"H_kv = {kv}", contexts, mib),
                        series("this setting", [context], [nbytes / 2**20], style="points"),
                    ],
                    title="KV-cache size against the context",
                    xlabel="context C (tokens)",
                    ylabel="MiB",
                    xlog=True,
                    ylog=True,
                )
            ],
            f"{layers} layers, {kv} key-value heads of width {d_head}, context {context}, batch "
            f"{batch}, {dtype}: {nbytes:,} bytes.",
            extra={"bytes": nbytes},
        )

    return InteractiveFigure(
        "kv-cache",
        "The size of a key-value cache: 2 · L · B · H_kv · C · d_k numbers",
        controls,
        frame,
        compute="kv_cache",
        data={
            "contexts": contexts,
            "measured": list(measured),
            "bytes_per_number": {
                k: torch.empty((), dtype=v).element_size() for k, v in DTYPES.items()
            },
        },
    )


def schedule_and_adamw(
    warmups: Sequence[int] = (0, 10, 40, 100), steps: int = 200, lr: float = 0.1
) -> InteractiveFigure:
    """The learning rate of :func:`.train.lr_at` (warm-up, then cosine decay over ``steps`` updates)
    and the first updates of :func:`.training.optim.adamw_step` and of plain gradient descent under it,
    on the quadratic :math:`\\tfrac12(\\theta_1^2 + 20\\,\\theta_2^2)` from (2, 1)."""
    curvature = torch.tensor([1.0, 20.0], dtype=torch.float64)
    start = torch.tensor([2.0, 1.0], dtype=torch.float64)
    shown = [s for s in (0, 1, 2, 3, 5, 10, 20, 50, 100) if s < steps] + [steps]

    def run(warmup: int):
        cfg = train.TrainConfig(max_steps=steps, lr=lr, warmup_steps=warmup)
        rates = [train.lr_at(s, cfg) for s in range(steps)]
        adam, sgd, state = [start.clone()], [start.clone()], {}
        for s, rate in enumerate(rates, start=1):
            p = adam[-1].clone()
            optim.adamw_step([p], [curvature * p], state, rate, weight_decay=0.0, step=s)
            adam.append(p)
            sgd.append(sgd[-1] - rate * curvature * sgd[-1])
        return rates, torch.stack(adam), torch.stack(sgd)

    def loss(t: torch.Tensor) -> torch.Tensor:
        return 0.5 * (curvature * t * t).sum(-1)

    def frame(warmup: int) -> Frame:
        rates, adam, sgd = run(warmup)
        sentences = []
        for s in shown:
            eta = f"η_{s} = {rates[s - 1]:.3g}" if s else "before the first update"
            sentences.append(
                f"Warm-up {warmup}, after {s} updates ({eta}): AdamW at ({adam[s, 0]:.2f}, "
                f"{adam[s, 1]:.2f}), loss {float(loss(adam[s])):.3g}; gradient descent at "
                f"({sgd[s, 0]:.2f}, {sgd[s, 1]:.2f}), loss {float(loss(sgd[s])):.3g}."
            )
        return Frame(
            [
                lines(
                    [
                        series("η_s", range(1, steps + 1), rates),
                        series("so far", range(1, steps + 1), rates, upto="s"),
                    ],
                    title=f"Learning rate: warm-up {warmup}, cosine to {steps}",
                    xlabel="update s",
                    ylabel="η_s",
                    ylim=(0.0, 1.05 * lr),
                ),
                lines(
                    [
                        series("AdamW", adam[:, 0], adam[:, 1], style="both", upto="s"),
                        series(
                            "gradient descent",
                            sgd[:, 0],
                            sgd[:, 1],
                            style="both",
                            dashed=True,
                            upto="s",
                        ),
                        series("minimum", [0.0], [0.0], style="points"),
                    ],
                    title="Parameters (θ₁, θ₂) from (2, 1)",
                    xlabel="θ₁",
                    ylabel="θ₂",
                    xlim=(-0.5, 2.2),
                    ylim=(-1.1, 1.2),
                    square=True,
                ),
            ],
            sentences,
        )

    return InteractiveFigure(
        "schedule-adamw",
        f"Warm-up and cosine decay (peak {lr}), and the first updates of AdamW and of gradient descent",
        [
            Control("warmup", "warm-up steps", list(warmups), initial=1),
            Control(
                "s",
                "updates shown",
                [s + 1 for s in shown],
                [str(s) for s in shown],
                initial=3,
                reveal=True,
            ),
        ],
        frame,
    )


def scaling_fits(result, budgets: Sequence[int] | None = None) -> InteractiveFigure:
    """The runs of the scaling study (``bench/scaling.py``'s result, a :class:`.results.Result` or its
    dict): for a chosen budget (of
    ``budgets``, default all), the validation losses against the model size, the fit of
    :func:`.training.scaling.fit_power_law` to the sizes kept, and its prediction for a size left
    out."""
    result = getattr(result, "data", result)  # a results.Result or its JSON dict
    runs = result["runs"]
    recorded = sorted({int(r["steps"]) for r in runs})
    budgets = recorded if budgets is None else sorted(budgets)
    if not set(budgets) <= set(recorded):
        raise ValueError(f"budgets {budgets}: the study recorded {recorded}")
    held_names = {"none": "none", "middle": "the middle size", "largest": "the largest size"}

    def frame(steps: int, held: str) -> Frame:
        chosen = sorted((r for r in runs if int(r["steps"]) == steps), key=lambda r: r["params"])
        N = [float(r["params"]) for r in chosen]
        loss = [float(r["val_loss"]) for r in chosen]
        out = {"none": None, "middle": len(chosen) // 2, "largest": len(chosen) - 1}[held]
        keep = [i for i in range(len(chosen)) if i != out]
        law = scaling.fit_power_law([N[i] for i in keep], [loss[i] for i in keep])
        grid = torch.logspace(math.log10(N[0] / 1.5), math.log10(N[-1] * 1.5), 60).tolist()
        curves = [
            series(
                "measured, in the fit",
                [N[i] for i in keep],
                [loss[i] for i in keep],
                style="points",
            ),
            series(f"fit: {law.a:.3g} N^−{law.alpha:.3f} + {law.c:.3g}", grid, law(grid)),
        ]
        text = (
            f"{steps} steps: the fit to {len(keep)} sizes has α = {law.alpha:.3f} and "
            f"L∞ = {law.c:.3g}"
        )
        if out is not None:
            predicted = float(law(N[out]))
            curves.append(series("held out: measured", [N[out]], [loss[out]], style="points"))
            curves.append(series("held out: predicted", [N[out]], [predicted], style="points"))
            text += (
                f"; it predicts {predicted:.3f} nats for the {held} size ({int(N[out]):,} "
                f"parameters), measured {loss[out]:.3f} (error {predicted - loss[out]:+.3f})."
            )
        else:
            text += "."
        all_loss = [float(r["val_loss"]) for r in runs]
        return Frame(
            [
                lines(
                    curves,
                    title=f"Validation loss after {steps} steps",
                    xlabel="parameters N",
                    ylabel="validation loss (nats)",
                    xlog=True,
                    ylim=(min(all_loss) - 0.05, max(all_loss) + 0.05),
                )
            ],
            text,
        )

    return InteractiveFigure(
        "scaling-fits",
        f"The scaling runs ({result.get('machine', 'one machine')}): choose the budget and a size to "
        "hold out of the fit",
        [
            Control("steps", "budget (steps)", budgets, initial=len(budgets) - 1, kind="select"),
            Control(
                "held",
                "held out",
                list(held_names),
                list(held_names.values()),
                initial=2,
                kind="select",
            ),
        ],
        frame,
    )
