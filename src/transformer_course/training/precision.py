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
    r"""Whether adding each update :math:`\Delta` to its weight :math:`\vartheta`, both stored in
    ``dtype``, leaves the weight unchanged:

    .. math:: |\Delta| < 2^{\nu - p},\qquad \nu = \lfloor\log_2|\vartheta|\rfloor

    with :math:`p` the format's bits of significand (8 for bfloat16, so the bound is
    :math:`2^{\nu - 8}`, half the spacing :math:`2^{\nu - 7}` of bfloat16 numbers between
    :math:`2^\nu` and :math:`2^{\nu+1}`). Exact for weights strictly inside their interval; at a power
    of two the spacing below is half the spacing above, and at exactly half a spacing rounding to even
    decides.

    Implements: eq-train-bf16

    Raises:
        ValueError: a zero weight (it has no exponent), or a format this function does not know.
    """
    if dtype not in SIGNIFICAND_BITS:
        raise ValueError(f"dtype must be one of {list(SIGNIFICAND_BITS)}, got {dtype}")
    if (weights == 0).any():
        raise ValueError("a weight of 0 has no binary exponent; leave zero weights out")
    nu = torch.floor(torch.log2(weights.abs().double()))  # the binary exponent of each weight
    return updates.abs().double() < 2.0 ** (nu - SIGNIFICAND_BITS[dtype])
