"""Gradient noise and the batch size: per-example gradients and McCandlish et al.'s (2018) simple noise
scale, estimated without bias (book eqs. ``eq-train-noise``, ``eq-train-noise-est``). Part of chapter
*Training* (:mod:`transformer_course.training`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn


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
