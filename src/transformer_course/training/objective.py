"""The objective every model of the course minimises: the mean cross-entropy over the scored
positions, evaluated with a log-sum-exp that does not overflow (book eqs. ``eq-train-ce``,
``eq-train-lse``). Part of chapter *Training* (:mod:`transformer_course.training`)."""

from __future__ import annotations

import torch
from torch import Tensor


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
