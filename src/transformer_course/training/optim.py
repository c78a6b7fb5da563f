"""Adam, AdamW and Adam with an L2 penalty, term by term, and clipping by the global norm (book eqs.
``eq-train-adam``, ``eq-train-l2``, ``eq-train-adamw``, ``eq-train-clip``; Kingma & Ba 2015;
Loshchilov & Hutter 2019; Pascanu et al. 2013). Part of chapter *Training*
(:mod:`transformer_course.training`); each is checked against PyTorch's own in
``tests/test_training.py``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


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
