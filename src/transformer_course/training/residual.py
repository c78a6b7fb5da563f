"""Initialisation and the residual stream: the root mean square of a GPT's stream after every block
(book eq. ``eq-train-resid``; Radford et al. 2019 on the scaled residual projections). Part of chapter
*Training* (:mod:`transformer_course.training`)."""

from __future__ import annotations

import torch
from torch import Tensor

from ..language_models import GPT


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
