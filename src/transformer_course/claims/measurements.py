"""Claims: measurements."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..language_models import attention_maps  # the one implementation, for any stack of blocks
from ..runtime import eval_mode
from .model import ClaimsLM


def normalised_entropy(A: Tensor) -> Tensor:
    r"""Mean normalised entropy of causal attention rows, book eq. ``eq-claims-entropy``:

    .. math:: \bar{\mathcal H} = \frac{1}{N-1}\sum_{n=2}^{N}
              \frac{-\sum_{m\le n} a_{nm}\log a_{nm}}{\log n}

    (rows counted from 1; row 1 can attend only to itself and is left out). 1 means every query
    spreads its weight evenly over the keys it may see, 0 that each puts all of it on one key.

    Args:
        A: causal weights ``(..., N, N)``, ``N >= 2``. Returns a tensor of shape ``A.shape[:-2]``.

    Implements: eq-claims-entropy
    """
    if A.dim() < 2 or A.shape[-1] != A.shape[-2] or A.shape[-1] < 2:
        raise ValueError(
            f"A must be square causal weights (..., N, N) with N >= 2, got {tuple(A.shape)}"
        )
    N = A.shape[-1]
    plogp = torch.where(A > 0, A * torch.log(A), torch.zeros_like(A))  # 0 log 0 = 0
    H_rows = -plogp.sum(dim=-1)[..., 1:]  # (..., N - 1): rows 2..N
    n_keys = torch.arange(2, N + 1, dtype=A.dtype, device=A.device)  # keys row n may see
    return (H_rows / torch.log(n_keys)).mean(dim=-1)


def _attention_figures(model: ClaimsLM, idx: Tensor, when: str) -> dict[str, Any]:
    maps = attention_maps(model, idx)  # L x (B, H, N, N)
    ent = [normalised_entropy(A).mean().item() for A in maps]
    top = [A[..., 1:, :].amax(dim=-1).mean().item() for A in maps]  # rows 2..N
    diag = [A.diagonal(dim1=-2, dim2=-1)[..., 1:].mean().item() for A in maps]
    return {
        f"entropy_{when}": sum(ent) / len(ent),
        f"max_weight_{when}": sum(top) / len(top),
        f"self_weight_{when}": sum(diag) / len(diag),
        f"entropy_by_layer_{when}": ent,
    }


def fc2_gradient_norms(model: ClaimsLM, idx: Tensor, targets: Tensor) -> list[float]:
    r"""The Frobenius norm of :math:`\partial\mathcal L/\partial W_2^{(\ell)}` (each block's second MLP
    matrix) for one batch, block by block: the quantity whose size at initialisation
    Xiong et al. (2020) bound for post-norm and pre-norm stacks. Gradients are cleared afterwards."""
    model.zero_grad(set_to_none=True)
    model(idx, targets)[1].backward()
    norms = [blk.mlp.fc2.weight.grad.norm().item() for blk in model.stack.blocks]
    model.zero_grad(set_to_none=True)
    return norms


def loss_by_position(model: nn.Module, batches: Sequence[tuple[Tensor, Tensor]]) -> Tensor:
    r"""Mean next-token loss at every position, book eq. ``eq-claims-position-loss``:
    :math:`\mathcal L_n = -\frac{1}{B_\text{val}}\sum_j \log p(t_{j,n+1} \mid t_{j,1..n})` over all
    :math:`B_\text{val}` windows of the ``batches`` (each ``(x, y)`` of shape ``(B, N)``). Returns
    ``(N,)`` float64.

    Implements: eq-claims-position-loss
    """
    total, count = None, 0
    with eval_mode(model):
        for x, y in batches:
            logits = model(x)[0]  # (B, N, |V|)
            nll = F.cross_entropy(logits.transpose(1, 2).float(), y, reduction="none")  # (B, N)
            total = nll.sum(0).double() if total is None else total + nll.sum(0).double()
            count += x.shape[0]
    if total is None:
        raise ValueError("no batches to evaluate")
    return total.cpu() / count
