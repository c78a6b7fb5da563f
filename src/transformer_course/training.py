"""Training: the objectives, AdamW, clipping, initialisation, gradient noise, data parallelism and a
small scaling-law fit.

Chapter: *Training* (Turner 2023 sec. 5 sets training aside as standard; Dramko 2025 sec. 5.2 on
teacher forcing; Kingma & Ba 2015; Loshchilov & Hutter 2019; Radford et al. 2019 on the residual
initialisation; McCandlish et al. 2018 on the gradient noise scale; Li et al. 2020 on PyTorch's
DistributedDataParallel; Kaplan et al. 2020 and Hoffmann et al. 2022 on scaling laws). The loop
itself, its schedule :func:`.train.lr_at` and its data-parallel mode are shared infrastructure in
:mod:`.train`; this module holds the equations the chapter derives, each checked against PyTorch's own
implementation in ``tests/test_training.py``.

Run as a script, it is the launcher of the chapter's data-parallel demonstration::

    torchrun --standalone --nproc_per_node 2 -m transformer_course.training ddp-demo --out run.json
    python -m transformer_course.training ddp-demo --out run.json     # one process, same global batch

(:func:`launch_ddp_demo` runs the first from Python.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor, nn

from .data import get_batch
from .language_models import GPT, SHAKESPEARE_CPU_RECIPE, TINY, GPTConfig, LMRecipe
from .tokens import CharTokenizer
from .train import TrainConfig, train

__all__ = [
    "DEMO_TEXT",
    "INSTABILITY_RECIPE",
    "NoiseScale",
    "PowerLaw",
    "adam_l2_step",
    "adamw_step",
    "clip_by_global_norm",
    "cross_entropy",
    "ddp_demo",
    "fit_power_law",
    "gradient_noise_scale",
    "launch_ddp_demo",
    "logsumexp",
    "main",
    "noise_scale_two_batch",
    "per_example_grads",
    "residual_stream_rms",
    "scaled_recipe",
    "scaling_analysis",
]


# ---------------------------------------------------------------------------------------------------
# The objective


def logsumexp(z: Tensor) -> Tensor:
    r""":math:`\log\sum_k e^{z_k}` over the last axis, computed stably, book eq. ``eq-train-lse``:

    .. math:: \log\sum_{k} e^{z_k} = m + \log\sum_{k} e^{z_k - m},\qquad m = \max_k z_k

    Every exponent is at most 0, so nothing overflows, and the largest term is exactly 1, so the sum
    never underflows to 0. ``z`` ``(..., K)`` -> ``(...)``.

    Implements: eq-train-lse

    Raises:
        ValueError: ``z`` has no entries on its last axis.
    """
    if z.dim() == 0 or z.shape[-1] == 0:
        raise ValueError(
            f"logsumexp needs at least one entry on the last axis, got {tuple(z.shape)}"
        )
    m = z.max(dim=-1, keepdim=True).values  # (..., 1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # an all -inf row stays -inf
    return m[..., 0] + torch.log(torch.exp(z - m).sum(dim=-1))  # (...)


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int | None = None) -> Tensor:
    r"""Mean cross-entropy of the targets under the softmax of the logits, evaluated with
    :func:`logsumexp`:

    .. math:: \mathcal{L} = \frac{1}{|\mathcal{P}|}\sum_{p \in \mathcal{P}}
              \Big(\log\sum_{k \in \mathcal{Y}} e^{z_{pk}} - z_{p y_p}\Big)

    over the scored positions :math:`\mathcal{P}` (every position, or those whose target is not
    ``ignore_index``: the padding of a sequence-to-sequence batch). The package's own evaluation;
    ``torch.nn.functional.cross_entropy`` is the independent check.

    Implements: eq-train-ce

    Args:
        logits: ``(..., |Y|)``, one score per class of the set ``Y`` (``|V|`` for a language model).
        targets: integer class ids of shape ``logits.shape[:-1]``.
        ignore_index: a target id whose positions are left out of the sum and of the count.

    Raises:
        ValueError: mismatched shapes, non-integer targets, a target outside ``[0, K)``, or every
            position ignored (the mean of nothing).
    """
    if logits.dim() < 1 or targets.shape != logits.shape[:-1]:
        raise ValueError(
            f"targets {tuple(targets.shape)} must have the shape of logits without its last axis, "
            f"{tuple(logits.shape[:-1])} (logits are (..., K) with K classes)"
        )
    if targets.dtype not in (torch.long, torch.int32, torch.int64, torch.int16, torch.uint8):
        raise ValueError(f"targets must be integer class ids, got {targets.dtype}")
    K = logits.shape[-1]
    Z, y = logits.reshape(-1, K), targets.reshape(-1).long()  # (P, K), (P,)
    keep = torch.ones_like(y, dtype=torch.bool) if ignore_index is None else y != ignore_index
    if not keep.any():
        raise ValueError(
            f"every target equals ignore_index={ignore_index}: there is no position to score"
        )
    if (y[keep] < 0).any() or (y[keep] >= K).any():
        raise ValueError(
            f"targets must lie in [0, {K}) (or equal ignore_index), got {y[keep].min()}..{y[keep].max()}"
        )
    Z, y = Z[keep], y[keep]  # the scored positions
    picked = Z.gather(-1, y[:, None])[:, 0]  # Z[p, y_p], (P,)
    return (logsumexp(Z) - picked).mean()


# ---------------------------------------------------------------------------------------------------
# Adam, AdamW and Adam with an L2 penalty


def _check_lists(params: Sequence[Tensor], grads: Sequence[Tensor], step: int) -> None:
    if len(params) != len(grads):
        raise ValueError(
            f"{len(params)} parameters but {len(grads)} gradients; pass one per tensor"
        )
    for i, (p, g) in enumerate(zip(params, grads, strict=True)):
        if p.shape != g.shape:
            raise ValueError(
                f"parameter {i} has shape {tuple(p.shape)} but its gradient {tuple(g.shape)}"
            )
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise ValueError(
            f"step counts the updates from 1 (the bias correction divides by 1 - beta^step), got "
            f"{step!r}"
        )


def _adam_direction(
    g: Tensor, m: Tensor, u: Tensor, betas: tuple[float, float], eps: float, step: int
) -> Tensor:
    """Update the moments ``m``, ``u`` in place with ``g``; return ``m_hat / (sqrt(u_hat) + eps)``."""
    beta1, beta2 = betas
    m.mul_(beta1).add_((1 - beta1) * g)  # m_s = beta1 m_{s-1} + (1 - beta1) g_s
    u.mul_(beta2).add_((1 - beta2) * g * g)  # u_s = beta2 u_{s-1} + (1 - beta2) g_s^2
    m_hat = m / (1 - beta1**step)  # bias corrections
    u_hat = u / (1 - beta2**step)
    return m_hat / (torch.sqrt(u_hat) + eps)


def _moments(state: dict, params: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    if "m" not in state:
        state["m"] = [torch.zeros_like(p) for p in params]  # m_0 = 0
        state["u"] = [torch.zeros_like(p) for p in params]  # u_0 = 0
    return state["m"], state["u"]


@torch.no_grad()
def adamw_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: dict,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    step: int = 1,
) -> None:
    r"""One AdamW update of ``params`` in place (Kingma & Ba 2015; Loshchilov & Hutter 2019):

    .. math:: \mathbf{m}_s = \beta_1\mathbf{m}_{s-1} + (1-\beta_1)\mathbf{g}_s,\quad
              \mathbf{u}_s = \beta_2\mathbf{u}_{s-1} + (1-\beta_2)\mathbf{g}_s^2,\quad
              \hat{\mathbf{m}}_s = \frac{\mathbf{m}_s}{1-\beta_1^s},\quad
              \hat{\mathbf{u}}_s = \frac{\mathbf{u}_s}{1-\beta_2^s}

              \theta_s = \theta_{s-1} - \eta_s\Big(\frac{\hat{\mathbf{m}}_s}{\sqrt{\hat{\mathbf{u}}_s}
              + \epsilon} + \lambda\,\theta_{s-1}\Big)

    The decay :math:`\lambda\theta` is *decoupled*: it never enters the moments. This is PyTorch's
    parametrisation, and equals ``torch.optim.AdamW``: the decay is multiplied by the learning rate
    :math:`\eta_s`. Loshchilov and Hutter (Algorithm 2) write
    :math:`\theta_s = \theta_{s-1} - \rho_s(\alpha\,\hat{\mathbf{m}}_s/(\sqrt{\hat{\mathbf{u}}_s}
    + \epsilon) + \lambda'\theta_{s-1})` with a base rate :math:`\alpha` and a schedule multiplier
    :math:`\rho_s`, so their decay follows the schedule but not :math:`\alpha`: the two agree when
    :math:`\eta_s = \alpha\rho_s` and :math:`\lambda' = \alpha\lambda`.

    Implements: eq-train-adam, eq-train-adamw

    Args:
        params, grads: matching lists of tensors (any shapes).
        state: the moments ``{"m": [...], "u": [...]}``; pass ``{}`` at the first step.
        lr: :math:`\eta_s`; betas: :math:`(\beta_1, \beta_2)`; eps: :math:`\epsilon`;
        weight_decay: :math:`\lambda`; step: :math:`s`, counted from 1.

    Raises:
        ValueError: mismatched lists or shapes, or ``step < 1``.
    """
    _check_lists(params, grads, step)
    ms, us = _moments(state, params)
    for p, g, m, u in zip(params, grads, ms, us, strict=True):
        direction = _adam_direction(g, m, u, betas, eps, step)
        p.sub_(lr * (direction + weight_decay * p))  # decoupled: lambda * theta_{s-1}


@torch.no_grad()
def adam_l2_step(
    params: Sequence[Tensor],
    grads: Sequence[Tensor],
    state: dict,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    step: int = 1,
) -> None:
    r"""One Adam update with an L2 penalty in the gradient:
    :math:`\mathbf{g}_s \leftarrow \mathbf{g}_s + \lambda\theta_{s-1}`, then the Adam update of
    :func:`adamw_step` with :math:`\lambda = 0`. The penalty passes through the moments and is divided
    by :math:`\sqrt{\hat{\mathbf{u}}_s}` like the rest of the gradient. Equals ``torch.optim.Adam`` with
    ``weight_decay``. Arguments and errors as :func:`adamw_step`.

    Implements: eq-train-adam, eq-train-l2
    """
    _check_lists(params, grads, step)
    ms, us = _moments(state, params)
    for p, g, m, u in zip(params, grads, ms, us, strict=True):
        p.sub_(lr * _adam_direction(g + weight_decay * p, m, u, betas, eps, step))


# ---------------------------------------------------------------------------------------------------
# Clipping


def clip_by_global_norm(grads: Sequence[Tensor], max_norm: float) -> tuple[list[Tensor], Tensor]:
    r"""Clip gradients by their global norm:

    .. math:: \lVert\mathbf{g}\rVert = \Big(\sum_{\vartheta}\lVert\mathbf{g}_\vartheta\rVert_2^2\Big)^{1/2},

              \mathbf{g}_\vartheta \leftarrow \mathbf{g}_\vartheta \cdot
              \min\Big(1, \frac{\kappa}{\lVert\mathbf{g}\rVert}\Big)

    over the parameter tensors :math:`\vartheta` of :math:`\theta`, with :math:`\kappa` =
    ``max_norm``. One factor for every tensor, so the direction of the whole gradient is kept
    (Pascanu et al. 2013). ``torch.nn.utils.clip_grad_norm_``, which the loop calls, multiplies by
    :math:`\kappa / (\lVert\mathbf{g}\rVert + 10^{-6})` instead: relative to this function's factor
    that is smaller by :math:`10^{-6} / (\lVert\mathbf{g}\rVert + 10^{-6})`, which is below
    :math:`10^{-6}/\kappa` whenever clipping acts (:math:`\lVert\mathbf{g}\rVert > \kappa`), so below
    :math:`10^{-6}` for the loop's :math:`\kappa = 1`, but larger for a smaller threshold.

    Implements: eq-train-clip

    Returns:
        the clipped gradients (new tensors; the inputs are not changed) and the norm before clipping.

    Raises:
        ValueError: no gradients, or ``max_norm <= 0``.
    """
    if len(grads) == 0:
        raise ValueError("no gradients to clip")
    if not max_norm > 0:
        raise ValueError(f"max_norm (kappa) must be > 0, got {max_norm}")
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads))  # ||g||, in float64
    factor = torch.clamp(max_norm / total, max=1.0)  # min(1, kappa / ||g||)
    return [(g * factor).to(g.dtype) for g in grads], total.to(grads[0].dtype)


# ---------------------------------------------------------------------------------------------------
# Initialisation and the residual stream


def residual_stream_rms(model: GPT, idx: Tensor) -> Tensor:
    r"""Root mean square of the residual stream :math:`X^{(\ell)}` after each block of a GPT: entry
    ``ell`` is :math:`\big(\frac{1}{BND}\sum X^{(\ell)2}\big)^{1/2}` for
    ``ell = 0`` (embeddings plus positions) to ``L`` (before the final LayerNorm). ``idx`` ``(B, N)``
    -> ``(L + 1,)``. Runs without gradients in the model's current mode.

    Implements: eq-train-resid
    """
    with torch.no_grad():
        X = model.pos_emb(model.tok_emb(idx))  # X^(0), (B, N, D)
        rms = [X.pow(2).mean().sqrt()]
        for block in model.stack.blocks:
            X = block(X)  # X^(ell), (B, N, D)
            rms.append(X.pow(2).mean().sqrt())
    return torch.stack(rms)


# ---------------------------------------------------------------------------------------------------
# Gradient noise and the batch size


def per_example_grads(
    model: nn.Module, loss_fn: Callable[[nn.Module, tuple], Tensor], examples: Sequence[tuple]
) -> Tensor:
    """The gradient of ``loss_fn(model, example)`` for each example, flattened: ``(n_ex, |theta|)``
    with ``|theta|`` the number of parameters (each tied tensor once). One backward pass per example;
    gradients of the model are left as they were found."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for example in examples:
        grads = torch.autograd.grad(loss_fn(model, example), params, allow_unused=True)
        rows.append(
            torch.cat(
                [
                    (torch.zeros_like(p) if g is None else g).flatten()
                    for p, g in zip(params, grads, strict=True)
                ]
            )
        )
    return torch.stack(rows)  # (n_ex, P)


@dataclass(frozen=True)
class NoiseScale:
    r"""Estimates of McCandlish et al.'s gradient noise: :math:`\operatorname{tr}\Sigma`, the squared
    length :math:`\lVert\bar{\mathbf{g}}\rVert^2` of the true mean gradient, and their ratio
    :math:`B_\text{simple}` (``inf`` when the estimate of :math:`\lVert\bar{\mathbf{g}}\rVert^2` is
    not positive: the noise swamps the gradient at these sample sizes)."""

    B_simple: float
    tr_sigma: float
    g_sq: float


def noise_scale_two_batch(
    sq_small: float, sq_big: float, B_small: float, B_big: float
) -> NoiseScale:
    r"""McCandlish et al.'s (2018, app. A.1) unbiased estimates from the squared norms of gradients
    measured at two batch sizes. Since :math:`\mathbb{E}\lVert\hat{\mathbf{g}}_B\rVert^2 =
    \lVert\bar{\mathbf{g}}\rVert^2 + \operatorname{tr}\Sigma / B`,

    .. math:: \widehat{\lVert\bar{\mathbf{g}}\rVert^2}
              = \frac{B_\text{big}\lVert\hat{\mathbf{g}}_\text{big}\rVert^2
              - B_\text{small}\lVert\hat{\mathbf{g}}_\text{small}\rVert^2}{B_\text{big} - B_\text{small}},
              \qquad
              \widehat{\operatorname{tr}\Sigma} = \frac{\lVert\hat{\mathbf{g}}_\text{small}\rVert^2
              - \lVert\hat{\mathbf{g}}_\text{big}\rVert^2}{1/B_\text{small} - 1/B_\text{big}},

    and :math:`B_\text{simple} \approx \widehat{\operatorname{tr}\Sigma} /
    \widehat{\lVert\bar{\mathbf{g}}\rVert^2}`. ``sq_small`` and ``sq_big`` should each be averaged
    over several batches before the ratio is taken (the ratio of unbiased estimates is not unbiased).

    Implements: eq-train-noise-est

    Raises:
        ValueError: ``B_small`` not below ``B_big``, or a batch size below 1.
    """
    if not 1 <= B_small < B_big:
        raise ValueError(f"need 1 <= B_small < B_big, got B_small={B_small}, B_big={B_big}")
    g_sq = (B_big * sq_big - B_small * sq_small) / (B_big - B_small)
    tr_sigma = (sq_small - sq_big) / (1 / B_small - 1 / B_big)
    return NoiseScale(tr_sigma / g_sq if g_sq > 0 else float("inf"), float(tr_sigma), float(g_sq))


def gradient_noise_scale(G: Tensor) -> NoiseScale:
    r"""The simple noise scale :math:`B_\text{simple} = \operatorname{tr}\Sigma /
    \lVert\bar{\mathbf{g}}\rVert^2` of McCandlish et al. (2018), estimated from per-example
    gradients ``G`` ``(n_ex, |theta|)`` drawn independently from the data.

    The plug-in ratio (the examples' covariance over the squared length of their mean) is biased:
    :math:`\mathbb{E}\lVert\frac{1}{n}\sum_e \mathbf{g}_e\rVert^2 = \lVert\bar{\mathbf{g}}\rVert^2 +
    \operatorname{tr}\Sigma / n`, so with few examples it underestimates :math:`B_\text{simple}`,
    badly once :math:`B_\text{simple}` approaches ``n_ex``. This uses :func:`noise_scale_two_batch`
    with batches of one example (the mean of :math:`\lVert\mathbf{g}_e\rVert^2`) and of all
    ``n_ex`` (the squared length of their mean).

    Implements: eq-train-noise

    Raises:
        ValueError: fewer than two examples.
    """
    if G.dim() != 2 or G.shape[0] < 2:
        raise ValueError(
            f"need per-example gradients (n_ex, |theta|) with n_ex >= 2, got {tuple(G.shape)}"
        )
    G = G.double()
    sq_small = float(G.pow(2).sum(dim=1).mean())  # batches of one example
    sq_big = float(G.mean(dim=0).pow(2).sum())  # the batch of all n_ex
    return noise_scale_two_batch(sq_small, sq_big, 1, G.shape[0])


# ---------------------------------------------------------------------------------------------------
# Scaling laws


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
    with SciPy's trust-region least squares (:math:`0 \le \alpha \le 10`: a loss that does not fall
    with :math:`x` gets :math:`\alpha = 0`), from starts found by a log-log line through the points for
    a grid of values of :math:`c` below the smallest loss.

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
    for c0 in Y.min() - np.geomspace(1e-3, 1.0, 12) * (Y.max() - Y.min() + 1e-12) * 4:
        slope, intercept = np.polyfit(np.log(u), np.log(np.maximum(Y - c0, 1e-12)), 1)
        start = np.array([intercept, min(max(-slope, 1e-3), 9.9), c0])
        fit = least_squares(
            residuals, start, bounds=([-np.inf, 0.0, -np.inf], [np.inf, 10.0, np.inf]),
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


# ---------------------------------------------------------------------------------------------------
# The instability demonstration's recipe

INSTABILITY_RECIPE = LMRecipe(
    model=GPTConfig(vocab_size=65, block_size=32, n_layers=4, H=4, d_model=64, dropout=0.0),
    train=TrainConfig(max_steps=200, lr=3e-3, warmup_steps=0, eval_interval=200),
    batch_size=16,
    eval_batches=8,
)
"""A 4-block character GPT (about 210 thousand parameters) trained for 200 steps of 16 windows of 32
characters, without warm-up: the base of the chapter's learning-rate experiments (book sec.
*Instabilities*), which change one setting at a time with :meth:`.train.Recipe.with_train`."""


# ---------------------------------------------------------------------------------------------------
# Data parallelism: the demonstration run with and without torchrun

DEMO_TEXT = (
    "to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the "
    "slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
) * 20
"""The demonstration's corpus: a short text repeated, learnable in a few steps, with no download."""


def ddp_demo(steps: int = 20, batch_size: int = 16, dtype: str = "float32", seed: int = 0) -> dict:
    """Train a ``TINY`` GPT on :data:`DEMO_TEXT` with the course's loop, :func:`.train.train`, in
    this process: one rank of a ``torch.distributed`` group when one is initialised (the loop then
    wraps the model in DDP and trains each rank on its share of the global batch), otherwise alone
    on the whole global batch. The loss is :func:`cross_entropy` in the model's ``dtype``.

    Returns:
        ``{"losses", "grad_norms", "val_losses", "world_size", "replicas_identical",
        "replica_max_diff", ...}``: the training loss of the global batch and its gradient norm at
        every step, the loss on a held-out batch at the middle and the end, and a comparison of every
        rank's final parameters with rank 0's (bit for bit, then the largest difference).
    """
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    ranks = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if dist.is_initialized() and dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    tok = CharTokenizer.from_text(DEMO_TEXT)
    ids = tok.encode_tensor(DEMO_TEXT)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's too)
    model = GPT(dataclasses.replace(TINY, vocab_size=tok.vocab_size)).to(device, dt)
    C = model.config.block_size
    cfg = TrainConfig(
        max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=max(1, steps // 2), seed=seed,
        time_budget_s=3600.0,  # never reached; under DDP the ranks agree on it every step
    )  # fmt: skip
    held_out = get_batch(ids, C, 8, torch.Generator().manual_seed(seed + 1), device)

    def loss_fn(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return cross_entropy(m(x)[0], y)  # in the model's dtype (GPT's own loss is float32)

    def evaluate(m: nn.Module) -> dict[str, float]:  # every rank, on its own replica
        return {"val_loss": loss_fn(m, held_out).item()}

    hist = train(
        model,
        lambda g: get_batch(ids, C, batch_size, g, device),
        loss_fn,
        cfg,
        evaluate,
        progress=False,
        scored=lambda batch: batch[1].numel(),  # full windows: every target is scored
    )
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    identical, max_diff = True, 0.0
    if ranks[1] > 1:
        copies = [torch.empty_like(flat) for _ in range(ranks[1])]
        dist.all_gather(copies, flat)
        identical = all(torch.equal(c, copies[0]) for c in copies)
        max_diff = max(float((c - copies[0]).abs().max()) for c in copies)
    return {
        "losses": hist.train_loss,
        "grad_norms": hist.grad_norm,
        "val_losses": hist.evals["val_loss"],
        "world_size": ranks[1],
        "replicas_identical": identical,
        "replica_max_diff": max_diff,
        "dtype": dtype,
        "global_batch": batch_size,
    }


def launch_ddp_demo(
    nproc: int = 2,
    steps: int = 20,
    batch_size: int = 16,
    dtype: str = "float32",
    seed: int = 0,
    timeout: float = 300.0,
) -> dict:
    """Run :func:`ddp_demo` in ``nproc`` CPU processes under ``torchrun`` (gloo), one torch thread
    each, and return rank 0's result (see :func:`ddp_demo`) with the command line under ``"command"``.

    Raises:
        RuntimeError: torchrun failed; the message ends with its error output.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder) / "ddp_demo.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "-m", "transformer_course.training", "ddp-demo",
            "--steps", str(steps), "--batch-size", str(batch_size), "--dtype", dtype,
            "--seed", str(seed), "--out", str(out),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"torchrun exited with {done.returncode}:\n{(done.stderr or done.stdout)[-3000:]}"
            )
        result = json.loads(out.read_text())
    shown = ["torchrun", *command[3:]]  # python -m torch.distributed.run is torchrun
    return {**result, "command": " ".join([*shown[:-2], "--out", "run.json"])}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``ddp-demo`` runs :func:`ddp_demo` (in every process torchrun starts) and writes
    rank 0's result as JSON to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m transformer_course.training")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("ddp-demo", help="the chapter's data-parallel demonstration")
    demo.add_argument("--steps", type=int, default=20)
    demo.add_argument("--batch-size", type=int, default=16, help="the global batch")
    demo.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # started by torchrun
    if launched:
        backend = (
            "nccl" if torch.cuda.is_available() and os.environ.get("DDP_DEMO_CUDA") else "gloo"
        )
        dist.init_process_group(backend)
    try:
        result = ddp_demo(args.steps, args.batch_size, args.dtype, args.seed)
        if not launched or dist.get_rank() == 0:
            args.out.write_text(json.dumps(result))
    finally:
        if launched:
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
