"""Scaling laws: a power law in the model size fitted per budget, its predictions of sizes left out,
the recipe of a scaling study, and the minimum of a parabola in a log axis that the learning-rate sweep
and the IsoFLOP view both read (book eqs. ``eq-train-power``, ``eq-train-vertex``; Kaplan et al. 2020;
Hoffmann et al. 2022). Part of chapter *Training* (:mod:`transformer_course.training`);
``bench/scaling.py`` runs the study."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor

from ..language_models import SHAKESPEARE_CPU_RECIPE, LMRecipe


@dataclass(frozen=True)
class PowerLaw:
    r"""``loss(x) = a x^(-alpha) + c`` (Kaplan et al. 2020; Hoffmann et al. 2022): ``c`` is the
    book's :math:`\mathcal{L}_\infty`, the loss the fit approaches for large ``x``.

    Implements: eq-train-power
    """

    a: float
    alpha: float
    c: float

    def __call__(self, x: float | np.ndarray | Tensor) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return self.a * x ** (-self.alpha) + self.c


def fit_power_law(x: Sequence[float], loss: Sequence[float]) -> PowerLaw:
    r"""Least-squares fit of :math:`\mathcal{L}(x) = a\,x^{-\alpha} + c` (``c`` the book's
    :math:`\mathcal{L}_\infty`) to measured losses; ``x`` is a model size :math:`|\theta|` (or a
    compute budget).

    Minimises :math:`\sum_i (\mathcal{L}(x_i) - \mathcal{L}_i)^2` over :math:`(\log a, \alpha, c)`
    with SciPy's trust-region least squares, from starts found by a log-log line through the points for
    a grid of values of :math:`c` below the smallest loss. The bounds: :math:`0 \le \alpha \le 10` (a
    loss that does not fall with :math:`x` gets :math:`\alpha = 0`) and :math:`c \ge 0` (a
    cross-entropy is never negative). Points that lie on a straight line in :math:`\log x` end on the
    bound :math:`c = 0`; without it, the fit would trade a vanishing :math:`\alpha` against ever larger
    :math:`a` and :math:`-c` and stop only at its evaluation limit (book sec. *Scaling laws*).

    Raises:
        ValueError: fewer than four points (three parameters), a non-positive ``x``, or mismatched
            lengths.
    """
    from scipy.optimize import least_squares  # imported here: the package itself does not need it

    X, Y = np.asarray(x, dtype=np.float64), np.asarray(loss, dtype=np.float64)
    if X.shape != Y.shape or X.ndim != 1:
        raise ValueError(f"x and loss must be 1-D of the same length, got {X.shape} and {Y.shape}")
    if len(X) < 4:
        raise ValueError(f"a, alpha and c need at least four points to be fitted, got {len(X)}")
    if (X <= 0).any():
        raise ValueError("x (a size or a budget) must be positive")
    scale = float(np.exp(np.log(X).mean()))  # fit in x / scale: a well-conditioned problem
    u = X / scale

    def residuals(q: np.ndarray) -> np.ndarray:
        log_a, alpha, c = q
        return np.exp(log_a) * u ** (-alpha) + c - Y

    best = None
    starts = Y.min() - np.geomspace(1e-3, 1.0, 12) * (Y.max() - Y.min() + 1e-12) * 4
    for c0 in dict.fromkeys(np.maximum(starts, 0.0).tolist()):  # c >= 0: those below start on it
        slope, intercept = np.polyfit(np.log(u), np.log(np.maximum(Y - c0, 1e-12)), 1)
        start = np.array([intercept, min(max(-slope, 1e-3), 9.9), c0])
        fit = least_squares(
            residuals, start, bounds=([-np.inf, 0.0, 0.0], [np.inf, 10.0, np.inf]),
            method="trf", x_scale="jac", max_nfev=2000,
        )  # fmt: skip
        if best is None or fit.cost < best.cost:
            best = fit
    log_a, alpha, c = best.x
    return PowerLaw(a=float(np.exp(log_a) * scale**alpha), alpha=float(alpha), c=float(c))


def scaling_analysis(runs: Sequence[dict]) -> dict:
    r"""Fit :class:`PowerLaw` to the runs of a scaling study (``bench/scaling.py``), per budget.

    Each run is a dict with ``"steps"`` (its budget), ``"params"`` (:math:`|\theta|`) and
    ``"val_loss"``. Returns ``{"fits": {steps: {"a", "alpha", "c", "rms_residual"}}, "held_out":
    {...}}``: a fit for every budget with at least four sizes, and at the largest budget two
    predictions of a size left out of the fit, ``"interpolation"`` (the middle size, between the
    others) and ``"extrapolation"`` (the largest), each ``{"params", "measured", "predicted",
    "error"}`` (predicted minus measured, nats). ``held_out`` is empty with fewer than five sizes.
    """
    budgets = sorted({int(r["steps"]) for r in runs})
    fits, held_out = {}, {}
    for steps in budgets:
        chosen = sorted((r for r in runs if int(r["steps"]) == steps), key=lambda r: r["params"])
        if len(chosen) < 4:
            continue
        N = np.array([r["params"] for r in chosen], dtype=np.float64)
        loss = np.array([r["val_loss"] for r in chosen], dtype=np.float64)
        law = fit_power_law(N, loss)
        rms = float(np.sqrt(np.mean((law(N) - loss) ** 2)))
        fits[steps] = {"a": law.a, "alpha": law.alpha, "c": law.c, "rms_residual": rms}
        if steps == budgets[-1] and len(chosen) >= 5:
            for name, i in (
                ("interpolation", len(chosen) // 2),
                ("extrapolation", len(chosen) - 1),
            ):
                keep = np.arange(len(chosen)) != i
                predicted = float(fit_power_law(N[keep], loss[keep])(N[i]))
                held_out[name] = {
                    "params": int(N[i]),
                    "measured": float(loss[i]),
                    "predicted": predicted,
                    "error": predicted - float(loss[i]),
                }
    return {"fits": fits, "held_out": held_out}


def scaled_recipe(
    d_model: int,
    n_layers: int,
    steps: int,
    base: LMRecipe = SHAKESPEARE_CPU_RECIPE,
    d_head: int = 16,
    warmup_steps: int | None = None,
    eval_batches: int | None = None,
) -> LMRecipe:
    """``base`` with a GPT of width ``d_model`` and ``n_layers`` blocks (heads of width ``d_head``)
    trained for exactly ``steps`` steps: no time budget, one evaluation at the end. Every other
    setting (learning rate, warm-up, decay, batch, context) stays ``base``'s unless given, so the runs
    of a scaling study differ only in size and budget (``bench/scaling.py``).

    Raises:
        ValueError: ``d_model`` not divisible by ``d_head``, or ``steps`` not above the warm-up.
    """
    if d_model % d_head:
        raise ValueError(f"d_model={d_model} must be a multiple of d_head={d_head}")
    warmup = base.train.warmup_steps if warmup_steps is None else warmup_steps
    if steps <= warmup:
        raise ValueError(
            f"steps={steps} must exceed the {warmup} warm-up steps; train for longer or pass a "
            "shorter warmup_steps"
        )
    model = dataclasses.replace(base.model, d_model=d_model, n_layers=n_layers, H=d_model // d_head)
    cfg = dataclasses.replace(
        base.train, max_steps=steps, warmup_steps=warmup, time_budget_s=None, eval_interval=steps
    )
    return dataclasses.replace(
        base, model=model, train=cfg, eval_batches=eval_batches or base.eval_batches
    )


@dataclass(frozen=True)
class LogParabola:
    r"""``y = c0 + c1 u + c2 u^2`` in ``u = ln x``, with its lowest point ``x_opt`` (where
    ``c2 > 0``) and the value there ``y_opt``."""

    c0: float
    c1: float
    c2: float
    x_opt: float
    y_opt: float

    def __call__(self, x: float | np.ndarray) -> np.ndarray:
        u = np.log(np.asarray(x, dtype=np.float64))
        return self.c0 + self.c1 * u + self.c2 * u**2


def log_parabola_minimum(x: Sequence[float], y: Sequence[float]) -> LogParabola:
    r"""Least-squares parabola through the points :math:`(\ln x_i, y_i)` and its vertex:

    .. math:: y \approx c_0 + c_1 u + c_2 u^2,\quad u = \ln x,\qquad
              x_\text{opt} = \exp\Big(-\frac{c_1}{2c_2}\Big)

    The best learning rate of a sweep on a log grid (:func:`.learning_rate.best_learning_rate`) and
    the best model size at a compute budget (:func:`.isoflop.isoflop_frontier`) are read this way:
    a loss is close to a parabola in the logarithm near its minimum, and the vertex can fall between
    grid points.

    Implements: eq-train-vertex

    Raises:
        ValueError: fewer than three points, a non-positive ``x``, or points that do not curve
            upwards (``c2 <= 0``: no minimum to read; the grid does not bracket it).
    """
    X, Y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if X.shape != Y.shape or X.ndim != 1 or len(X) < 3:
        raise ValueError(
            f"need at least three (x, y) points of equal length, got {X.shape}, {Y.shape}"
        )
    if (X <= 0).any():
        raise ValueError("x must be positive: the parabola is fitted in ln x")
    c2, c1, c0 = np.polyfit(np.log(X), Y, 2)
    if not c2 > 0:
        raise ValueError(
            f"the points curve downwards or not at all (c2 = {c2:.3g}): they do not bracket a "
            "minimum; extend the grid past the best point on both sides"
        )
    u = -c1 / (2 * c2)
    return LogParabola(
        float(c0), float(c1), float(c2), float(np.exp(u)), float(c0 + c1 * u + c2 * u**2)
    )
