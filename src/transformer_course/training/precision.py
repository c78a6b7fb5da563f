"""Mixed precision: which updates a low-precision weight cannot take (book eq. ``eq-train-bf16``;
Micikevicius et al. 2018 on keeping float32 weights). Part of chapter *Training*
(:mod:`transformer_course.training`); the loop's autocast is :func:`.train.autocast_context`."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["SIGNIFICAND_BITS", "update_rounded_away"]

SIGNIFICAND_BITS = {torch.bfloat16: 8, torch.float16: 11, torch.float32: 24, torch.float64: 53}
"""Bits of significand, the implicit leading one included, of each floating-point format."""


def update_rounded_away(
    weights: Tensor, updates: Tensor, dtype: torch.dtype = torch.bfloat16
) -> Tensor:
    r"""Whether adding each update :math:`\Delta` to its weight :math:`\omega` (stored in
    ``dtype``), with the sum rounded to ``dtype``, leaves the weight unchanged:

    .. math:: |\Delta| < 2^{\nu - p}\ \text{(}\Delta\text{ away from zero, or } |\omega| \ne
              2^\nu\text{)},\qquad |\Delta| < 2^{\nu - p - 1}\ \text{(}\Delta\text{ towards zero
              and } |\omega| = 2^\nu\text{)},\qquad \nu = \lfloor\log_2|\omega|\rfloor

    with :math:`p` the format's bits of significand (8 for bfloat16). The numbers of the format
    between :math:`2^\nu` and :math:`2^{\nu+1}` are :math:`2^{\nu - p + 1}` apart, and a sum rounds
    back to :math:`\omega` when it lies nearer to it than to its neighbour, so within half that
    spacing. Below a power of two the spacing halves (the numbers below :math:`2^\nu` are those of the
    interval under it): a weight of exactly 1 in bfloat16 keeps an update of :math:`+0.003`
    (:math:`< 2^{-8}`) but not one of :math:`-0.003` (:math:`> 2^{-9}`), which takes it to
    :math:`1 - 2^{-8} = 0.99609375`. At exactly half a spacing rounding to even decides: the weight
    stays when the last bit of its significand is 0 (a power of two's is). Exact for normal numbers
    (not for the subnormals below :math:`2^{-126}` in bfloat16), for a sum formed exactly and rounded
    once.

    Implements: eq-train-bf16

    Raises:
        ValueError: a zero weight (it has no exponent), or a format this function does not know.
    """
    if dtype not in SIGNIFICAND_BITS:
        raise ValueError(f"dtype must be one of {list(SIGNIFICAND_BITS)}, got {dtype}")
    if (weights == 0).any():
        raise ValueError("a weight of 0 has no binary exponent; leave zero weights out")
    p = SIGNIFICAND_BITS[dtype]
    w, d = weights.double(), updates.double()
    nu = torch.floor(torch.log2(w.abs()))  # the binary exponent of each weight
    ulp = 2.0 ** (nu - p + 1)  # spacing of the format's numbers in [2^nu, 2^(nu+1))
    towards_zero = torch.sign(d) == -torch.sign(w)
    at_power_of_two = w.abs() == 2.0**nu
    half_gap = torch.where(towards_zero & at_power_of_two, ulp / 4, ulp / 2)
    even = torch.remainder(w.abs() / ulp, 2) == 0  # the last bit of the significand is 0
    return (d.abs() < half_gap) | ((d.abs() == half_gap) & even)
