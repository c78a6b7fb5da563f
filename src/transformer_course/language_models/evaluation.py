"""Measuring a language model (chapter *Autoregressive language models*): perplexity and bits per
token, the two count-based baselines the chapter measures the GPT against (:func:`unigram_log_probs`,
:func:`bigram_log_probs`), and what the heads attend to (:func:`attention_maps`)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..runtime import eval_mode

__all__ = [
    "attention_maps",
    "bigram_log_probs",
    "bits_per_token",
    "perplexity",
    "unigram_log_probs",
]


def _mean_nll(nll: Tensor) -> float:
    nll = torch.as_tensor(nll, dtype=torch.float64)
    if nll.numel() == 0 or not torch.isfinite(nll).all() or (nll < 0).any():
        raise ValueError(
            "nll must hold at least one finite, non-negative negative log-likelihood (in nats), "
            "-log p of each scored token"
        )
    return float(nll.mean())


def perplexity(nll: Tensor) -> float:
    r"""Perplexity of per-token negative log-likelihoods ``nll`` (any shape, natural logs):
    :math:`\exp\big(\frac{1}{N}\sum_{n=1}^{N} -\log p(s_{n+1} \mid s_{1:n})\big)`, the exponential of the
    mean, which is the geometric mean of :math:`1/p`.

    Implements: eq-lm-perplexity

    A uniform guess over ``|V|`` tokens has perplexity ``|V|``: the model is as unsure as a choice
    among that many equally likely tokens (Jurafsky & Martin, ch. 3).
    """
    return math.exp(_mean_nll(nll))


def bits_per_token(nll: Tensor) -> float:
    r"""The mean of per-token negative log-likelihoods ``nll`` (natural logs) in bits,
    :math:`\mathcal{L} / \ln 2` (bits per character for a character model).

    Implements: eq-lm-bits
    """
    return _mean_nll(nll) / math.log(2)


def attention_maps(model: nn.Module, idx: Tensor) -> list[Tensor]:
    """Every head's attention weights for the token ids ``idx`` ``(B, N)``: one ``(B, H, N, N)`` tensor
    per block of ``model.stack`` (a :class:`GPT`, or any model built on a stack, e.g. chapter *Claims
    tested*'s ``ClaimsLM``), row ``n`` the weights with which token ``n`` attends to tokens ``1..n``.
    Each layer recomputes them (:meth:`.multihead.SelfAttention.attention_map`) from the input its
    block hands it during one forward pass in evaluation mode, without gradients (the fused attention
    kernel never forms them)."""
    if idx.dim() != 2:
        raise ValueError(f"idx must be token ids of shape (B, N), got shape {tuple(idx.shape)}")
    inputs: list[Tensor] = []
    hooks = [
        blk.attn.register_forward_pre_hook(lambda mod, args: inputs.append(args[0]))
        for blk in model.stack.blocks
    ]
    try:
        with eval_mode(model), torch.no_grad():
            model(idx)
            return [
                blk.attn.attention_map(X) for blk, X in zip(model.stack.blocks, inputs, strict=True)
            ]
    finally:
        for h in hooks:
            h.remove()


def _check_ids(ids: Tensor, vocab_size: int, alpha: float, least: int) -> None:
    if ids.dim() != 1 or ids.dtype not in (torch.long, torch.int32) or len(ids) < least:
        raise ValueError(
            f"ids must be a 1-D sequence of at least {least} integer token ids, got "
            f"{ids.dtype} {tuple(ids.shape)}"
        )
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (1 is add-one smoothing), got {alpha}")


def unigram_log_probs(ids: Tensor, vocab_size: int, alpha: float = 1.0) -> Tensor:
    r"""Log-probabilities ``(|V|,)`` of the smoothed unigram model,

    .. math:: p(w) = \frac{c(w) + \alpha}{N + \alpha|\mathcal{V}|}

    with ``c(w)`` the count of token ``w`` in ``ids`` (``N`` tokens); ``alpha = 1`` is add-one
    (Laplace) smoothing, so an unseen token keeps a small probability. Float64.

    Implements: eq-lm-ngram
    """
    _check_ids(ids, vocab_size, alpha, 1)
    counts = torch.bincount(ids.long(), minlength=vocab_size).double()  # c(w)
    return torch.log((counts + alpha) / (len(ids) + alpha * vocab_size))


def bigram_log_probs(ids: Tensor, vocab_size: int, alpha: float = 1.0) -> Tensor:
    r"""Log-probabilities ``(|V|, |V|)`` of the smoothed bigram model: row ``v`` is
    :math:`\log p(\cdot \mid v)`,

    .. math:: p(w \mid v) = \frac{c(v, w) + \alpha}{\sum_{w'} c(v, w') + \alpha|\mathcal{V}|}

    with ``c(v, w)`` the number of times ``w`` follows ``v`` in ``ids``. Float64.

    Implements: eq-lm-ngram
    """
    _check_ids(ids, vocab_size, alpha, 2)
    pairs = ids[:-1].long() * vocab_size + ids[1:].long()  # (v, w) as one index
    counts = torch.bincount(pairs, minlength=vocab_size**2).double().view(vocab_size, vocab_size)
    return torch.log((counts + alpha) / (counts.sum(dim=1, keepdim=True) + alpha * vocab_size))
