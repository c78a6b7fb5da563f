"""Sampling from a language model, with and without a key-value cache.

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1; Dramko 2025 sec. 5.3; Pope et al.
2023 on the cache). Both paths follow one context policy, so a cached run reproduces an uncached run
token for token:

* while the sequence fits in the context (``T <= block_size``) the model sees all of it;
* beyond that it sees the tokens from ``window_start(T, block_size)`` on: the window start jumps forward
  in steps of ``block_size // 2``, so at most ``block_size`` tokens are visible and, with a cache, the
  cache is rebuilt only once per jump (learned positions cannot slide one token at a time).

A prompt longer than the context is therefore cropped to its last tokens, as documented here.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .models import GPT
from .tokens import CharTokenizer

__all__ = ["generate", "generate_text", "next_token", "positions_processed", "window_start"]


def window_start(T: int, block_size: int) -> int:
    """First visible position of a length-``T`` sequence: the smallest multiple of ``block_size // 2``
    that leaves at most ``block_size`` tokens in view."""
    if T <= block_size:
        return 0
    jump = max(1, block_size // 2)
    return -(-(T - block_size) // jump) * jump  # ceil((T - block_size) / jump) * jump


def positions_processed(
    prompt_len: int, max_new_tokens: int, block_size: int, use_cache: bool
) -> int:
    """How many token positions :func:`generate` pushes through the model, per sequence.

    Uncached, every call runs the whole visible window; cached, one new token, except for a rebuild of
    the window when :func:`window_start` jumps. The ratio of the two counts is the cache's saving in
    the per-token matrix products (book chapter *Autoregressive language models*).
    """
    if prompt_len < 1 or max_new_tokens < 0:
        raise ValueError(
            f"need prompt_len >= 1 and max_new_tokens >= 0, got {prompt_len}, {max_new_tokens}"
        )
    s = window_start(prompt_len, block_size)
    total = prompt_len - s  # the prompt's forward pass
    for T in range(prompt_len + 1, prompt_len + max_new_tokens):  # no call after the last token
        s_new = window_start(T, block_size)
        total += 1 if use_cache and s_new == s else T - s_new
        s = s_new
    return total


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Choose the next token from ``logits`` ``(B, V)``; returns ``(B, 1)``.

    Greedy takes the arg-max. Otherwise it samples from :math:`\operatorname{softmax}(z / \tau)`, keeping
    only the ``top_k`` largest logits when ``top_k`` is given (Holtzman et al. 2020 discuss why
    truncation helps).
    """
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (use greedy=True for arg-max), got {temperature}"
        )
    z = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[:, -1:]  # (B, 1)
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    sample = torch.multinomial(probs.cpu(), 1, generator=generator)  # CPU: one generator everywhere
    return sample.to(logits.device)


@torch.no_grad()
def generate(
    model: GPT,
    idx: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    return_logits: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Extend ``idx`` ``(B, T)`` by ``max_new_tokens`` tokens; returns ``(B, T + max_new_tokens)``.

    With ``return_logits=True`` also returns the logits each new token was chosen from,
    ``(B, max_new_tokens, V)`` (the tests compare cached and uncached logits with them).
    """
    if idx.dim() != 2 or idx.shape[1] == 0:
        raise ValueError(
            f"idx must be (B, T) with at least one token, got shape {tuple(idx.shape)}"
        )
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if max_new_tokens == 0:
        empty = idx.new_zeros(idx.shape[0], 0, model.config.vocab_size, dtype=torch.float32)
        return (idx, empty) if return_logits else idx
    was_training = model.training
    model.eval()
    C = model.config.block_size
    chosen_logits = []
    s = window_start(idx.shape[1], C)
    caches = model.new_caches() if use_cache else None
    logits = model(idx[:, s:], caches=caches)[0][:, -1]  # (B, V)
    for step in range(max_new_tokens):
        chosen_logits.append(logits)
        idx = torch.cat([idx, next_token(logits, temperature, top_k, greedy, generator)], dim=1)
        if step == max_new_tokens - 1:
            break  # the last token is chosen: no need to run the model on it
        T = idx.shape[1]
        s_new = window_start(T, C)
        if use_cache and s_new == s:
            logits = model(idx[:, -1:], caches=caches)[0][
                :, -1
            ]  # one new token, keys/values cached
        else:
            s = s_new
            caches = model.new_caches() if use_cache else None  # the window moved: rebuild
            logits = model(idx[:, s:], caches=caches)[0][:, -1]
    model.train(was_training)
    if return_logits:
        return idx, torch.stack(chosen_logits, dim=1)
    return idx


def generate_text(
    model: GPT, tokenizer: CharTokenizer, prompt: str, max_new_tokens: int, **kwargs
) -> str:
    """Encode ``prompt`` (unknown characters raise a ``ValueError`` listing them), generate, decode."""
    if not prompt:
        raise ValueError("the prompt is empty; give at least one character, e.g. '\\n'")
    device = next(model.parameters()).device
    idx = torch.tensor([tokenizer.encode(prompt)], dtype=torch.long, device=device)
    out = generate(model, idx, max_new_tokens, **kwargs)
    return tokenizer.decode(out[0].tolist())
