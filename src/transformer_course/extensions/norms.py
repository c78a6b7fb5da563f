"""Extensions: RMSNorm, the norm of modern decoders."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..runtime import shape_of as _shape


def rms_norm_reference(X: Tensor, gamma: Tensor, eps: float = 1e-5) -> Tensor:
    r"""RMSNorm of every token, book eq. ``eq-ext-rmsnorm`` (Zhang & Sennrich 2019):

    .. math:: \mathrm{RMS}(\mathbf{x}_n) = \sqrt{\tfrac1D \textstyle\sum_d X_{nd}^2 + \epsilon},\qquad
              \mathrm{RMSNorm}(X)_{nd} = \gamma_d\, \frac{X_{nd}}{\mathrm{RMS}(\mathbf{x}_n)}

    LayerNorm without the mean and without ``beta``. ``eps`` sits inside the root, as in
    ``torch.nn.RMSNorm``. Args: ``X`` ``(..., D)``; ``gamma`` ``(D,)``. Raises ``ValueError`` when
    ``gamma`` does not have the tokens' width.
    """
    if gamma.shape != (X.shape[-1],):
        raise ValueError(
            f"gamma has shape {_shape(gamma)} but must be (D,) = ({X.shape[-1]},) for X of shape "
            f"{_shape(X)}"
        )
    rms = torch.sqrt((X**2).mean(dim=-1, keepdim=True) + eps)  # (..., 1): one value per token
    return gamma * X / rms


class RMSNorm(nn.Module):
    """RMSNorm with a learned gain ``gamma`` (``weight``, ``(D,)``), book eq. ``eq-ext-rmsnorm``.

    Computes ``X * rsqrt(mean(X^2) + eps) * gamma``, in float32 for half-precision inputs; it does not
    call ``torch.nn.RMSNorm`` (PyTorch 2.4+), so the book and the tests can compare the two.

    Implements: eq-ext-rmsnorm
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))  # gamma

    def forward(self, X: Tensor) -> Tensor:
        if X.shape[-1] != self.weight.shape[0]:
            raise ValueError(
                f"RMSNorm({self.weight.shape[0]}) got tokens of width {X.shape[-1]} (X {_shape(X)})"
            )
        Xf = X.float() if X.dtype in (torch.float16, torch.bfloat16) else X
        inv_rms = torch.rsqrt(Xf.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (Xf * inv_rms).to(X.dtype) * self.weight
