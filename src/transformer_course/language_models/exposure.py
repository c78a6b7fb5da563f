"""Exposure bias (chapter *Autoregressive language models*): what teacher forcing hides. Teacher-forced
and free-running greedy predictions (:func:`teacher_forced_vs_free_running`), and the loss on a true
continuation after a prefix with replaced tokens (:func:`sample_under_teacher_forcing`,
:func:`replace_prefix_tokens`, :func:`continuation_loss`)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ..runtime import eval_mode
from .generation import generate
from .model import GPT

__all__ = [
    "continuation_loss",
    "replace_prefix_tokens",
    "sample_under_teacher_forcing",
    "teacher_forced_vs_free_running",
]


def teacher_forced_vs_free_running(
    model: GPT, windows: Tensor, prompt_len: int
) -> tuple[Tensor, Tensor]:
    """Greedy predictions of the tokens after a true prompt, two ways.

    Implements: eq-lm-forced-free

    ``windows`` ``(B, T)`` holds true text with ``T <= block_size``; the first ``prompt_len`` tokens
    are the prompt. Returns ``(forced, free)``, each ``(B, T - prompt_len)``: ``forced[:, j]`` is the
    arg-max prediction of token ``prompt_len + j`` given the **true** text before it (teacher
    forcing, one forward pass), ``free[:, j]`` the token the model generates there greedily from the
    prompt, conditioning on its **own** earlier output. Compare either with
    ``windows[:, prompt_len:]``.
    """
    if windows.dim() != 2 or not 1 <= prompt_len < windows.shape[1]:
        raise ValueError(
            f"need windows (B, T) with 1 <= prompt_len < T, got {tuple(windows.shape)} and "
            f"prompt_len={prompt_len}"
        )
    if windows.shape[1] > model.config.block_size:
        raise ValueError(
            f"windows of {windows.shape[1]} tokens exceed the context of "
            f"{model.config.block_size}; use shorter windows"
        )
    with eval_mode(model), torch.no_grad():
        logits = model(windows[:, :-1])[0]  # (B, T - 1, |V|): position n predicts token n + 1
        forced = logits[:, prompt_len - 1 :].argmax(dim=-1)  # tokens prompt_len .. T - 1
    n_new = windows.shape[1] - prompt_len
    free = generate(model, windows[:, :prompt_len], n_new, greedy=True)[:, prompt_len:]
    return forced, free


def sample_under_teacher_forcing(
    model: GPT, x: Tensor, generator: torch.Generator | None = None
) -> Tensor:
    """For every position ``n >= 1`` of the true text ``x`` ``(B, N)``, a token drawn from
    ``p(. | x[:, :n])`` (one teacher-forced pass; the input scheduled sampling feeds); position 0 is
    ``x[:, 0]``. Returns ``(B, N)``. Draws on the CPU from ``generator``."""
    with eval_mode(model), torch.no_grad():
        probs = torch.softmax(model(x[:, :-1])[0].float(), dim=-1)  # (B, N - 1, |V|)
    drawn = torch.multinomial(probs.flatten(0, 1).cpu(), 1, generator=generator)
    return torch.cat([x[:, :1], drawn.view(x.shape[0], -1).to(x.device)], dim=1)


def replace_prefix_tokens(
    x: Tensor,
    replacement: Tensor,
    rho: float,
    prefix_len: int,
    generator: torch.Generator | None = None,
) -> Tensor:
    """``x`` ``(B, N)`` with each of its first ``prefix_len`` tokens, independently with probability
    ``rho``, replaced by the token of ``replacement`` (same shape) at the same place; the tokens
    from ``prefix_len`` on are kept. The coin flips are drawn on the CPU from ``generator``."""
    if replacement.shape != x.shape or not 0.0 <= rho <= 1.0:
        raise ValueError(
            f"need replacement of shape {tuple(x.shape)} and 0 <= rho <= 1, got "
            f"{tuple(replacement.shape)} and rho={rho}"
        )
    where = torch.rand(x.shape, generator=generator) < rho  # (B, N) bool, on the CPU
    where[:, prefix_len:] = False
    return torch.where(where.to(x.device), replacement, x)


def continuation_loss(model: GPT, x: Tensor, y: Tensor, prefix_len: int) -> Tensor:
    """Per-token loss ``(B, N - prefix_len + 1)`` of the true continuation: the cross-entropy of
    ``y[:, n]`` (the token after ``x[:, n]``) for ``n = prefix_len - 1, ..., N - 1``, each predicted
    from ``x[:, :n + 1]``, which may hold replaced tokens in its prefix (:func:`replace_prefix_tokens`).
    """
    with eval_mode(model), torch.no_grad():
        logits = model(x)[0][:, prefix_len - 1 :]  # (B, N - prefix_len + 1, |V|)
    return F.cross_entropy(logits.transpose(1, 2).float(), y[:, prefix_len - 1 :], reduction="none")
