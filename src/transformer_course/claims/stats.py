"""Claims: statistics of paired runs (no scipy: the tests compare each function with scipy.stats)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def _as_float64(values: Sequence[float] | Tensor, name: str) -> Tensor:
    t = torch.as_tensor(values, dtype=torch.float64).flatten()
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} holds NaN or inf ({t.tolist()}); drop diverged runs first")
    return t


def student_t_cdf(t: float, df: int) -> float:
    r"""The Student t distribution's CDF :math:`F_\nu(z)` at ``t`` :math:`= z` for an integer ``df``
    :math:`= \nu \ge 1`, book eq. ``eq-claims-t-cdf``, in closed form (Abramowitz & Stegun 1964,
    26.7.3-4):

    .. math:: \chi = \arctan\frac{|z|}{\sqrt\nu},\qquad
              G_\nu(z) = \begin{cases}
              \frac{2}{\pi}\Big(\chi + \sin\chi\sum_{j=0}^{(\nu-3)/2}
              \frac{(2j)!!}{(2j+1)!!}\cos^{2j+1}\chi\Big) & \nu \text{ odd}\\[4pt]
              \sin\chi \sum_{j=0}^{(\nu-2)/2} \frac{(2j-1)!!}{(2j)!!} \cos^{2j}\chi
              & \nu \text{ even}
              \end{cases},\qquad F_\nu(z) = \tfrac12 + \tfrac12\operatorname{sign}(z)\,G_\nu(z)

    where :math:`G_\nu(z)` is the probability that a Student variable with :math:`\nu` degrees of
    freedom lies between :math:`-|z|` and :math:`|z|` (the code builds the double-factorial ratios as
    running products). Raises ``ValueError`` for
    ``df < 1`` or a non-integer ``df``.

    Implements: eq-claims-t-cdf
    """
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df must be an integer >= 1 (n - 1 for n paired seeds), got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd
        total, coef, power = 0.0, 1.0, c
        for j in range((df - 1) // 2):
            if j > 0:
                coef *= 2 * j / (2 * j + 1)
            total += coef * power
            power *= c * c
        G = 2.0 / math.pi * (theta + s * total)
    else:  # even
        total, coef, power = 0.0, 1.0, 1.0
        for j in range(df // 2):
            if j > 0:
                coef *= (2 * j - 1) / (2 * j)
            total += coef * power
            power *= c * c
        G = s * total
    return 0.5 + math.copysign(0.5 * G, t)


def student_t_quantile(p: float, df: int) -> float:
    """The ``p``-quantile of Student's t with ``df`` degrees of freedom: the ``t`` with
    :func:`student_t_cdf` ``(t, df) = p``, found by bisection to float64 precision.

    Raises ``ValueError`` unless ``0 < p < 1``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie strictly between 0 and 1, got {p}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while student_t_cdf(hi, df) < p:  # bracket the quantile
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if student_t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


def paired_t_interval(
    baseline: Sequence[float] | Tensor, variant: Sequence[float] | Tensor, confidence: float = 0.95
) -> tuple[float, float, float]:
    r"""Mean paired difference and its t-interval, book eq. ``eq-claims-paired-t``:

    .. math:: d_i = y_i - x_i,\quad \bar d = \frac1n\sum_i d_i,\quad
              s_d^2 = \frac{1}{n-1}\sum_i (d_i - \bar d)^2,\quad
              \bar d \pm t_{n-1,\,(1+c)/2}\,\frac{s_d}{\sqrt n}

    with :math:`n` (the book's :math:`n_\text{seeds}`) pairs and confidence :math:`c`,
    ``x`` the baseline's figure and ``y`` the variant's for the same seed ``i``.

    Implements: eq-claims-paired-t

    Returns:
        ``(mean, low, high)``.

    Raises:
        ValueError: for fewer than two pairs, sequences of different lengths, non-finite values, or a
            confidence outside (0, 1).
    """
    x, y = _as_float64(baseline, "baseline"), _as_float64(variant, "variant")
    if x.shape != y.shape:
        raise ValueError(
            f"paired samples need one baseline value per variant value, got {len(x)} and {len(y)}"
        )
    if len(x) < 2:
        raise ValueError(f"a t-interval needs at least 2 pairs, got {len(x)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    d = y - x  # (n,)
    n = len(d)
    mean = d.mean().item()
    sd = d.std(unbiased=True).item()  # divide by n - 1
    half = student_t_quantile((1.0 + confidence) / 2.0, n - 1) * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def sign_test(baseline: Sequence[float] | Tensor, variant: Sequence[float] | Tensor) -> float:
    r"""Two-sided exact sign test of paired figures, book eq. ``eq-claims-sign``: with :math:`n`
    non-zero differences of which :math:`k` are positive,

    .. math:: p = \min\Big(1,\ 2\sum_{i=0}^{\min(k,\,n-k)} \binom{n}{i}\, 2^{-n}\Big).

    Ties (equal figures) are dropped. With :math:`n` pairs the smallest attainable ``p`` is
    :math:`2^{1-n}` (0.0625 for five seeds). Returns 1.0 when every pair ties.

    Implements: eq-claims-sign
    """
    x, y = _as_float64(baseline, "baseline"), _as_float64(variant, "variant")
    if x.shape != y.shape:
        raise ValueError(
            f"paired samples need one baseline value per variant value, got {len(x)} and {len(y)}"
        )
    d = y - x
    n = int((d != 0).sum())
    if n == 0:
        return 1.0
    k = int((d > 0).sum())
    tail = sum(math.comb(n, i) for i in range(min(k, n - k) + 1)) / 2**n
    return min(1.0, 2.0 * tail)


def width_ratio(
    baseline: Sequence[float] | Tensor, variant: Sequence[float] | Tensor, confidence: float = 0.95
) -> float:
    r"""How wide the paired t-interval (:func:`paired_t_interval`) is, relative to the two-sample
    t-interval with pooled variance (scipy's ``ttest_ind``), book eq. ``eq-claims-width-ratio``:

    .. math:: \frac{w_\text{paired}}{w_\text{unpaired}}
              = \frac{t_{n-1,\,(1+c)/2}}{t_{2n-2,\,(1+c)/2}}
                \sqrt{1 - \frac{2\, r_{xy}\, s_x s_y}{s_x^2 + s_y^2}}

    for :math:`n` pairs (the book's :math:`n_\text{seeds}`), where :math:`2 r_{xy} s_x s_y` is twice the
    sample covariance of the pairs. Below 1, pairing narrowed the interval.

    Implements: eq-claims-width-ratio

    Raises:
        ValueError: for fewer than two pairs, sequences of different lengths, non-finite values, or
            two samples that do not vary at all.
    """
    x, y = _as_float64(baseline, "baseline"), _as_float64(variant, "variant")
    if x.shape != y.shape or len(x) < 2:
        raise ValueError(f"need two or more pairs of figures, got {len(x)} and {len(y)} values")
    n = len(x)
    spread = (x.var() + y.var()).item()  # s_x^2 + s_y^2 (n - 1 in the denominators)
    if spread == 0.0:
        raise ValueError("neither sample varies: both intervals have width 0")
    cov = ((x - x.mean()) * (y - y.mean())).sum().item() / (n - 1)  # r_xy s_x s_y
    p = (1.0 + confidence) / 2.0
    t_ratio = student_t_quantile(p, n - 1) / student_t_quantile(p, 2 * n - 2)
    return t_ratio * math.sqrt(1.0 - 2.0 * cov / spread)
