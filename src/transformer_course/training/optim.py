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
    g: Tensor, m: Tensor, c: Tensor, betas: tuple[float, float], eps: float, step: int
) -> Tensor:
    """Update the moments ``m``, ``c`` in place with ``g``; return ``m_hat / (sqrt(c_hat) + eps)``."""
    beta1, beta2 = betas
    m.mul_(beta1).add_((1 - beta1) * g)  # m_u = beta1 m_{u-1} + (1 - beta1) g_u
    c.mul_(beta2).add_((1 - beta2) * g * g)  # c_u = beta2 c_{u-1} + (1 - beta2) g_u^2
    m_hat = m / (1 - beta1**step)  # bias corrections
    c_hat = c / (1 - beta2**step)
    return m_hat / (torch.sqrt(c_hat) + eps)


def _moments(state: dict, params: Sequence[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
    if "m" not in state:
        state["m"] = [torch.zeros_like(p) for p in params]  # m_0 = 0
        state["c"] = [torch.zeros_like(p) for p in params]  # c_0 = 0
    return state["m"], state["c"]


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

    .. math:: \mathbf{m}_u = \beta_1\mathbf{m}_{u-1} + (1-\beta_1)\mathbf{g}_u,\quad
              \mathbf{c}_u = \beta_2\mathbf{c}_{u-1} + (1-\beta_2)\mathbf{g}_u^2,\quad
              \hat{\mathbf{m}}_u = \frac{\mathbf{m}_u}{1-\beta_1^u},\quad
              \hat{\mathbf{c}}_u = \frac{\mathbf{c}_u}{1-\beta_2^u}

              \theta_u = \theta_{u-1} - \eta_u\Big(\frac{\hat{\mathbf{m}}_u}{\sqrt{\hat{\mathbf{c}}_u}
              + \epsilon} + \lambda\,\theta_{u-1}\Big)

    at update :math:`u` (Kingma and Ba's :math:`t`; :math:`\mathbf{c}_u` is their :math:`v_t`). The
    decay :math:`\lambda\theta` is *decoupled*: it never enters the moments. This is PyTorch's
    parametrisation, and equals ``torch.optim.AdamW``: the decay is multiplied by the learning rate
    :math:`\eta_u`. Loshchilov and Hutter (Algorithm 2) split the rate into a base rate and a schedule
    multiplier, :math:`\eta_u = \eta_\text{base}\rho_u`, and write
    :math:`\theta_u = \theta_{u-1} - \rho_u(\eta_\text{base}\,\hat{\mathbf{m}}_u/
    (\sqrt{\hat{\mathbf{c}}_u} + \epsilon) + \lambda'\theta_{u-1})`, so their decay follows the
    schedule but not :math:`\eta_\text{base}`: the two agree when :math:`\lambda' =
    \eta_\text{base}\lambda`.

    Implements: eq-train-adam, eq-train-adamw

    Args:
        params, grads: matching lists of tensors (any shapes).
        state: the moments ``{"m": [...], "c": [...]}``; pass ``{}`` at the first step.
        lr: :math:`\eta_u`; betas: :math:`(\beta_1, \beta_2)`; eps: :math:`\epsilon`;
        weight_decay: :math:`\lambda`; step: :math:`u`, counted from 1.

    Raises:
        ValueError: mismatched lists or shapes, or ``step < 1``.
    """
    _check_lists(params, grads, step)
    ms, cs = _moments(state, params)
    for p, g, m, c in zip(params, grads, ms, cs, strict=True):
        direction = _adam_direction(g, m, c, betas, eps, step)
        p.sub_(lr * (direction + weight_decay * p))  # decoupled: lambda * theta_{u-1}


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
    :math:`\mathbf{g}_u \leftarrow \mathbf{g}_u + \lambda\theta_{u-1}`, then the Adam update of
    :func:`adamw_step` with :math:`\lambda = 0`. The penalty passes through the moments and is divided
    by :math:`\sqrt{\hat{\mathbf{c}}_u}` like the rest of the gradient. Equals ``torch.optim.Adam`` with
    ``weight_decay``. Arguments and errors as :func:`adamw_step`.

    Implements: eq-train-adam, eq-train-l2
    """
    _check_lists(params, grads, step)
    ms, cs = _moments(state, params)
    for p, g, m, c in zip(params, grads, ms, cs, strict=True):
        p.sub_(lr * _adam_direction(g + weight_decay * p, m, c, betas, eps, step))


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
