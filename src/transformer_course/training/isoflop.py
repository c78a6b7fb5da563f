"""The IsoFLOP view of a scaling study: at a fixed compute budget, which model size reaches the lowest
loss, and how that size grows with the budget.

Part of chapter *Training* (:mod:`transformer_course.training`; book eqs. ``eq-train-surface`` and
``eq-train-isoflop``; Hoffmann et al. 2022, who read the compute-optimal size three ways, two of them
here; Kaplan et al. 2020 for the estimate ``C = 6 N D``). A run of ``|theta|`` parameters trained on
``n_tok`` tokens costs about ``C = 6 |theta| n_tok`` FLOPs. Two readings of the same runs:

* **IsoFLOP profiles** (Hoffmann et al.'s second approach): for each budget ``C``, the loss of every
  size trained with that budget, and the vertex of a parabola in ``ln |theta|`` through them
  (:func:`isoflop_profiles`, :func:`isoflop_minima`). A study that trained each size for a few fixed
  step counts has measured each size at a few budgets only; the profiles interpolate each size's loss
  linearly in ``ln C`` between them and never extrapolate.
* **A loss surface** fitted to every run (their third approach),
  ``L = L_inf + a |theta|^-alpha + a_tok n_tok^-alpha_tok`` (:func:`fit_loss_surface`), whose
  minimum along ``6 |theta| n_tok = C`` is in closed form (:meth:`LossSurface.n_opt`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .scaling import log_parabola_minimum

__all__ = [
    "LossSurface",
    "fit_frontier",
    "fit_loss_surface",
    "isoflop_minima",
    "isoflop_profiles",
]


def isoflop_profiles(runs: Sequence[dict], levels: Sequence[float]) -> dict[float, list[dict]]:
    r"""For each compute budget in ``levels``, the loss of every model size at that budget.

    Each run is a dict with ``"params"`` (:math:`|\theta|`), ``"flops"`` (its :math:`\mathcal{C} =
    6|\theta| n_\text{tok}`) and ``"val_loss"``; runs of the same ``params`` are one size trained for
    several budgets. A size appears at a budget it was not trained for only when two of its runs
    bracket the budget; its loss there is interpolated linearly in :math:`\ln\mathcal{C}`.

    Returns:
        ``{level: [{"params", "loss", "measured"}, ...]}``, sizes in increasing order;
        ``measured`` says the loss is a run's own, not interpolated.
    """
    by_size: dict[int, list[tuple[float, float]]] = {}
    for r in runs:
        by_size.setdefault(int(r["params"]), []).append((float(r["flops"]), float(r["val_loss"])))
    out: dict[float, list[dict]] = {}
    for level in levels:
        points = []
        for params, curve in sorted(by_size.items()):
            curve.sort()
            for (c0, l0), (c1, l1) in itertools.pairwise(curve):
                if c0 <= level <= c1:
                    t = (math.log(level) - math.log(c0)) / (math.log(c1) - math.log(c0))
                    points.append({"params": params, "loss": l0 + t * (l1 - l0),
                                   "measured": level in (c0, c1)})  # fmt: skip
                    break
            else:
                exact = [loss for c, loss in curve if c == level]
                if exact:
                    points.append({"params": params, "loss": exact[0], "measured": True})
        out[float(level)] = points
    return out


def isoflop_minima(profiles: dict[float, list[dict]]) -> dict[float, dict]:
    r"""The compute-optimal size of each IsoFLOP profile: the vertex of the parabola in
    :math:`\ln|\theta|` through its points (book eq. ``eq-train-vertex``), where the profile has at
    least three sizes and its lowest loss is not at either end (the minimum is bracketed).

    Returns:
        ``{level: {"sizes", "bracketed", "params_opt", "loss_opt", "best_measured"}}``: ``params_opt``
        and ``loss_opt`` are ``None`` where the minimum is not bracketed; ``best_measured`` is the size
        of the profile's lowest loss.
    """
    out = {}
    for level, points in profiles.items():
        n = [p["params"] for p in points]
        loss = [p["loss"] for p in points]
        row = {"sizes": len(points), "bracketed": False, "params_opt": None, "loss_opt": None,
               "best_measured": n[int(np.argmin(loss))] if points else None}  # fmt: skip
        if len(points) >= 3 and 0 < int(np.argmin(loss)) < len(points) - 1:
            fit = log_parabola_minimum(n, loss)
            row.update(bracketed=True, params_opt=fit.x_opt, loss_opt=fit.y_opt)
        out[level] = row
    return out


def fit_frontier(levels: Sequence[float], params_opt: Sequence[float]) -> tuple[float, float]:
    r"""The line :math:`\ln|\theta|_\text{opt} = \zeta \ln\mathcal{C} + \ln G` through the
    compute-optimal sizes, by least squares; returns :math:`(\zeta, G)`.

    Raises:
        ValueError: fewer than two budgets.
    """
    if len(levels) < 2 or len(levels) != len(params_opt):
        raise ValueError(
            f"the frontier needs the optimal size at two budgets or more, got {len(params_opt)}"
        )
    zeta, log_g = np.polyfit(np.log(levels), np.log(params_opt), 1)
    return float(zeta), float(np.exp(log_g))


@dataclass(frozen=True)
class LossSurface:
    r"""The loss of a model of :math:`|\theta|` parameters trained on :math:`n_\text{tok}` tokens,
    Hoffmann et al.'s form (their eq. 2, in the book's letters):

    .. math:: \mathcal{L}(|\theta|, n_\text{tok}) = \mathcal{L}_\infty + a|\theta|^{-\alpha}
              + a_\text{tok}\, n_\text{tok}^{-\alpha_\text{tok}}

    Implements: eq-train-surface
    """

    c: float  # L_inf
    a: float
    alpha: float
    a_tok: float
    alpha_tok: float

    def __call__(self, params, tokens) -> np.ndarray:
        N, T = np.asarray(params, dtype=np.float64), np.asarray(tokens, dtype=np.float64)
        return self.c + self.a * N ** (-self.alpha) + self.a_tok * T ** (-self.alpha_tok)

    @property
    def zeta(self) -> float:
        r""":math:`\zeta = \alpha_\text{tok} / (\alpha + \alpha_\text{tok})`, the exponent of
        :math:`|\theta|_\text{opt} \propto \mathcal{C}^\zeta`."""
        return self.alpha_tok / (self.alpha + self.alpha_tok)

    def n_opt(self, compute) -> np.ndarray:
        r"""The size of the lowest loss at the budget :math:`\mathcal{C}` = ``compute``, where
        :math:`n_\text{tok} = \mathcal{C} / (6|\theta|)`: setting the derivative in :math:`|\theta|`
        to zero,

        .. math:: |\theta|_\text{opt} = G\,(\mathcal{C}/6)^{\zeta},\qquad
                  G = \Big(\frac{\alpha a}{\alpha_\text{tok} a_\text{tok}}\Big)^{1/(\alpha +
                  \alpha_\text{tok})}

        Implements: eq-train-isoflop
        """
        G = (self.alpha * self.a / (self.alpha_tok * self.a_tok)) ** (
            1 / (self.alpha + self.alpha_tok)
        )
        return G * (np.asarray(compute, dtype=np.float64) / 6) ** self.zeta


def fit_loss_surface(runs: Sequence[dict]) -> tuple[LossSurface, float]:
    r"""Least-squares fit of :class:`LossSurface` to runs with ``"params"``, ``"tokens"`` and
    ``"val_loss"``; returns the surface and the root mean square residual (nats).

    Five parameters: fit them only to runs that vary both the size and the tokens, and read the
    result with care when there are few (the book's IsoFLOP section shows how much one budget more or
    less moves it). Minimises over :math:`(\ln a, \alpha, \ln a_\text{tok}, \alpha_\text{tok},
    \mathcal{L}_\infty)` with SciPy's trust-region least squares, exponents in :math:`[0, 5]` and
    :math:`\mathcal{L}_\infty \ge 0` (a cross-entropy is never negative: runs that a surface with a
    negative constant would fit better end on the bound, as :func:`.scaling.fit_power_law` does), from
    a grid of starts.

    Raises:
        ValueError: fewer than six runs, or non-positive sizes or token counts.
    """
    from scipy.optimize import least_squares  # imported here: the package itself does not need it

    N = np.array([r["params"] for r in runs], dtype=np.float64)
    T = np.array([r["tokens"] for r in runs], dtype=np.float64)
    Y = np.array([r["val_loss"] for r in runs], dtype=np.float64)
    if len(Y) < 6:
        raise ValueError(f"five parameters need at least six runs, got {len(Y)}")
    if (N <= 0).any() or (T <= 0).any():
        raise ValueError("sizes and token counts must be positive")
    sN, sT = float(np.exp(np.log(N).mean())), float(np.exp(np.log(T).mean()))  # well conditioned

    def residuals(q: np.ndarray) -> np.ndarray:
        log_a, alpha, log_b, beta, c = q
        return np.exp(log_a) * (N / sN) ** -alpha + np.exp(log_b) * (T / sT) ** -beta + c - Y

    lower, upper = [-np.inf, 0, -np.inf, 0, 0.0], [np.inf, 5, np.inf, 5, np.inf]  # L_inf >= 0
    best = None
    for alpha0 in (0.1, 0.3, 0.6):
        for beta0 in (0.1, 0.3, 0.6):
            for c0 in dict.fromkeys(np.maximum(Y.min() - np.array([0.1, 0.5, 1.0]), 0.0).tolist()):
                start = np.array([np.log(0.3), alpha0, np.log(0.3), beta0, c0])
                fit = least_squares(
                    residuals, start, bounds=(lower, upper), method="trf", x_scale="jac",
                    max_nfev=4000,
                )  # fmt: skip
                if best is None or fit.cost < best.cost:
                    best = fit
    log_a, alpha, log_b, beta, c = best.x
    surface = LossSurface(
        c=float(c), a=float(np.exp(log_a) * sN**alpha), alpha=float(alpha),
        a_tok=float(np.exp(log_b) * sT**beta), alpha_tok=float(beta),
    )  # fmt: skip
    return surface, float(np.sqrt(np.mean(best.fun**2)))
