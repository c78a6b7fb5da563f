"""Generation with the GPT of chapter *Autoregressive language models*: the next token's distribution
(temperature, top-k), greedy and sampled choice, and :func:`generate` with and without the key-value
cache; and the chapter's first writer, the bigram model (:func:`generate_bigram`), with
:func:`side_by_side` to print its text beside the GPT's.

Generation follows one context policy with and without the cache, so a cached run reproduces an
uncached run token for token:

* while the sequence fits in the context (``T <= block_size``) the model sees all of it;
* beyond that it sees the tokens from ``window_start(T, block_size)`` on: the window start jumps forward
  in steps of ``block_size // 2``, so at most ``block_size`` tokens are visible and, with a cache, the
  cache is rebuilt only once per jump (learned positions cannot slide one token at a time under a
  cache: every cached key would change its position).

A prompt longer than the context is therefore cropped to its last tokens. ``scratch/gpt.py``'s
``generate`` (the lab's) slides its window one token at a time instead, and has no cache; the two
choose the same tokens while the sequence fits in the context (``tests/test_scratch_gpt.py``).
"""

from __future__ import annotations

import itertools
import textwrap

import torch
from torch import Tensor

from ..runtime import eval_mode
from ..tokens import CharTokenizer
from .model import GPT

__all__ = [
    "generate",
    "generate_bigram",
    "generate_text",
    "generate_with_logits",
    "next_token",
    "next_token_probs",
    "positions_processed",
    "side_by_side",
    "window_start",
]


def generate_bigram(
    log_p2: Tensor, idx: Tensor, max_new_tokens: int, generator: torch.Generator | None = None
) -> Tensor:
    r"""Extend ``idx`` ``(B, T)`` by ``max_new_tokens`` tokens, each drawn from the bigram table's row
    of the token before it, ``log_p2[v]`` = :math:`\log p_2(\cdot \mid v)` (``(|V|, |V|)``, e.g.
    :func:`.evaluation.bigram_log_probs`); returns ``(B, T + max_new_tokens)``."""
    probs = log_p2.exp()  # (|V|, |V|): row v is p_2(. | v)
    for _ in range(max_new_tokens):
        nxt = torch.multinomial(probs[idx[:, -1]], 1, generator=generator)  # (B, 1)
        idx = torch.cat([idx, nxt], dim=1)  # (B, T + 1)
    return idx


def side_by_side(texts: dict[str, str], width: int = 44) -> str:
    """Texts in columns ``width`` characters wide, each under its title (the keys), every line
    wrapped: the chapter and lab 7 print the bigram model's sample beside the GPT's."""
    columns = [
        [row for line in text.splitlines() for row in textwrap.wrap(line, width) or [""]]
        for text in texts.values()
    ]
    rows = [list(texts), ["-" * width] * len(texts), *itertools.zip_longest(*columns, fillvalue="")]
    return "\n".join("    ".join(cell.ljust(width) for cell in row).rstrip() for row in rows)


def window_start(T: int, block_size: int) -> int:
    """First visible position of a length-``T`` sequence: the smallest multiple of
    ``block_size // 2`` that leaves at most ``block_size`` tokens in view.

    Implements: eq-lm-window
    """
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


def next_token_probs(logits: Tensor, temperature: float = 1.0, top_k: int | None = None) -> Tensor:
    r"""The distribution that :func:`next_token` samples from: :math:`\operatorname{softmax}(z/\tau)`
    over the ``top_k`` largest logits (all of them when ``top_k`` is ``None``), ``(B, |V|)`` in float32.

    Implements: eq-lm-temperature, eq-lm-topk
    """
    if temperature <= 0:
        raise ValueError(
            f"temperature must be > 0 (use greedy=True for arg-max), got {temperature}"
        )
    z = logits.float() / temperature
    if top_k is not None:
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        kth = torch.topk(z, min(top_k, z.shape[-1]), dim=-1).values[..., -1:]  # (B, 1)
        z = z.masked_fill(z < kth, float("-inf"))
    return torch.softmax(z, dim=-1)


def next_token(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    greedy: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    r"""Choose the next token from ``logits`` ``(B, |V|)``; returns ``(B, 1)``.

    Implements: eq-lm-temperature, eq-lm-topk

    Greedy takes the arg-max. Otherwise it samples from :func:`next_token_probs`,
    :math:`\operatorname{softmax}(z / \tau)` over the ``top_k`` largest logits when ``top_k`` is given
    (top-k sampling, Fan et al. 2018; Holtzman et al. 2020 discuss why truncating helps). Sampling
    draws on the CPU from ``generator``, so a seed gives the same text on every device.
    """
    if greedy:
        return logits.argmax(dim=-1, keepdim=True)
    probs = next_token_probs(logits, temperature, top_k)
    sample = torch.multinomial(probs.cpu(), 1, generator=generator)  # CPU: one generator everywhere
    return sample.to(logits.device)


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
    """Extend ``idx`` ``(B, T)`` by ``max_new_tokens`` tokens, each chosen by :func:`next_token`;
    returns the ids ``(B, T + new)`` (and, with ``return_logits``, the logits each new token was
    chosen from, ``(B, new, |V|)``). With ``use_cache`` each step runs only the newest token through
    the model; without it, the whole visible window (:func:`window_start`). Both choose the same tokens.
    """
    if idx.dim() != 2 or idx.shape[1] == 0 or max_new_tokens < 0:
        raise ValueError(
            f"need idx (B, T) with at least one token and max_new_tokens >= 0, got shape "
            f"{tuple(idx.shape)} and max_new_tokens={max_new_tokens}"
        )
    B, T0, C, V = idx.shape[0], idx.shape[1], model.config.block_size, model.config.vocab_size
    out = torch.cat([idx, idx.new_empty(B, max_new_tokens)], dim=1)  # the prompt, then new ids
    chosen = torch.empty(B, max_new_tokens if return_logits else 0, V, device=idx.device)
    with eval_mode(model), torch.inference_mode():  # no autograd bookkeeping at all
        caches = model.new_caches() if use_cache else None
        start = window_start(T0, C)  # the first visible position
        logits = model(idx[:, start:], caches=caches)[0][:, -1] if max_new_tokens else None
        for T in range(T0, T0 + max_new_tokens):
            if return_logits:
                chosen[:, T - T0] = logits
            out[:, T : T + 1] = next_token(logits, temperature, top_k, greedy, generator)
            if T + 1 == T0 + max_new_tokens:
                break  # the last token is chosen: no need to run the model on it
            new_start = window_start(T + 1, C)
            if use_cache and new_start == start:
                logits = model(out[:, T : T + 1], caches=caches)[0][:, -1]  # the newest token only
                continue
            start = new_start  # the window moved (or no cache): run every visible token
            for cache in caches or []:
                cache.reset()
            logits = model(out[:, start : T + 1], caches=caches)[0][:, -1]  # (B, |V|)
    return (out, chosen) if return_logits else out


def generate_with_logits(
    model: GPT, idx: Tensor, max_new_tokens: int, **kwargs
) -> tuple[Tensor, Tensor]:
    """:func:`generate` that also returns the logits each new token was chosen from: ``(ids (B, T +
    new), logits (B, new, |V|))``. Keyword arguments as :func:`generate`."""
    return generate(model, idx, max_new_tokens, return_logits=True, **kwargs)


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
