"""Autoregressive language models: the key-value cache, a decoder-only GPT, generation, and its recipe.

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1; MIT 6.390 sec. 9.1 and 9.5.2; Dramko
2025 sec. 5.2-5.3; Pope et al. 2023 on the cache). Every part of :class:`GPT` is the course's own: token
lookup (:mod:`.tokens`), learned positions (:mod:`.position`) and a stack of causal pre-norm blocks
(:mod:`.block`) over :class:`.multihead.SelfAttention`.

Generation follows one context policy with and without the cache, so a cached run reproduces an
uncached run token for token:

* while the sequence fits in the context (``T <= block_size``) the model sees all of it;
* beyond that it sees the tokens from ``window_start(T, block_size)`` on: the window start jumps forward
  in steps of ``block_size // 2``, so at most ``block_size`` tokens are visible and, with a cache, the
  cache is rebuilt only once per jump (learned positions cannot slide one token at a time).

A prompt longer than the context is therefore cropped to its last tokens.

Also the two count-based baselines the chapter measures the GPT against (:func:`unigram_log_probs`,
:func:`bigram_log_probs`), and the measurements of its section on exposure bias: teacher-forced and
free-running greedy predictions (:func:`teacher_forced_vs_free_running`), and the loss on a true
continuation after a prefix with replaced tokens (:func:`sample_under_teacher_forcing`,
:func:`replace_prefix_tokens`, :func:`continuation_loss`).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .block import PreNormBlock, TransformerStack
from .checkpoint import atomic_save
from .data import get_batch, tinyshakespeare_text, train_val_split
from .position import LearnedPositionalEmbedding
from .runtime import eval_mode
from .tokens import CharTokenizer
from .train import History, Recipe, TrainConfig, train

__all__ = [
    "GPT",
    "SHAKESPEARE_CPU",
    "SHAKESPEARE_CPU_RECIPE",
    "SHAKESPEARE_GPU",
    "SHAKESPEARE_GPU_RECIPE",
    "TINY",
    "GPTConfig",
    "KVCache",
    "LMRecipe",
    "LMRun",
    "attention_maps",
    "bigram_log_probs",
    "bits_per_token",
    "continuation_loss",
    "generate",
    "generate_text",
    "generate_with_logits",
    "gpt2_init",
    "next_token",
    "next_token_probs",
    "perplexity",
    "positions_processed",
    "replace_prefix_tokens",
    "sample_under_teacher_forcing",
    "teacher_forced_vs_free_running",
    "train_char_lm",
    "unigram_log_probs",
    "window_start",
]


# ---------------------------------------------------------------------------------------------------
# The key-value cache


class KVCache:
    r"""The keys and values of the tokens seen so far by one self-attention layer (Dramko 2025 sec.
    5.3) in buffers ``(B, H, capacity, d_k)``, allocated at the first :meth:`update` and written in
    place: appending copies only the new entries. For inference only (no gradients).

    Implements: eq-lm-kv-append
    """

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be a positive int, got {capacity!r}")
        self.capacity = capacity
        self.K: Tensor | None = None
        self.V: Tensor | None = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def reset(self) -> None:
        """Forget every position; the buffers are kept for the next sequence of the same shape."""
        self.length = 0

    def update(self, K_new: Tensor, V_new: Tensor) -> tuple[Tensor, Tensor]:
        """Write the new tokens' ``K_new, V_new`` ``(B, H, n, d)`` after the cached ones; return all
        keys and values so far, ``(B, H, length, d)`` views of the buffers."""
        start, end = self.length, self.length + K_new.shape[-2]
        if end > self.capacity:
            raise ValueError(
                f"the cache holds at most {self.capacity} positions but {end} were written; start a "
                "new cache (or crop the sequence) when the context is full"
            )
        if self.K is None or self.K.shape[:2] != K_new.shape[:2] or self.K.dtype != K_new.dtype:
            B, H, _, d_k = K_new.shape
            self.K = K_new.new_empty(B, H, self.capacity, d_k)
            self.V = V_new.new_empty(B, H, self.capacity, V_new.shape[-1])
        self.K.narrow(2, start, end - start).copy_(K_new)  # K[:, :, start:end] = K_new, in place
        self.V.narrow(2, start, end - start).copy_(V_new)
        self.length = end
        return self.K.narrow(2, 0, end), self.V.narrow(2, 0, end)  # K[:, :, :end], V[:, :, :end]


# ---------------------------------------------------------------------------------------------------
# The model


def gpt2_init(module: nn.Module) -> None:
    """GPT-2's initialisation of one module: N(0, 0.02) weights, zero biases (use ``model.apply``)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


@dataclass(frozen=True)
class GPTConfig:
    """Sizes of a GPT. ``vocab_size`` is ``|V|``, ``block_size`` the context length
    ``C``, ``n_layers`` the number of blocks ``L``, ``d_model`` the width ``D``, ``H`` the heads."""

    vocab_size: int = 65
    block_size: int = 256
    n_layers: int = 6
    H: int = 6
    d_model: int = 384
    dropout: float = 0.2
    tie_weights: bool = True

    def __post_init__(self) -> None:
        if self.d_model % self.H:
            raise ValueError(f"d_model={self.d_model} must be divisible by H={self.H}")
        if min(self.vocab_size, self.block_size, self.n_layers, self.H) < 1:
            raise ValueError(f"every size must be positive: {self}")


TINY = GPTConfig(vocab_size=65, block_size=32, n_layers=2, H=2, d_model=32, dropout=0.0)
"""For tests and quick demonstrations."""
SHAKESPEARE_CPU = GPTConfig(vocab_size=65, block_size=64, n_layers=2, H=4, d_model=128, dropout=0.0)
"""Sized for a 2-core CPU and a two-minute budget: shallow and narrow, so that many tokens are seen
(``bench/lm.py`` reports what it reaches; the performance page shows the figures)."""
SHAKESPEARE_GPU = GPTConfig(
    vocab_size=65, block_size=256, n_layers=6, H=6, d_model=384, dropout=0.2
)
"""nanoGPT's ``shakespeare_char`` size (Karpathy 2022): 6 layers, 6 heads, 384 wide, context 256."""


def _check_token_ids(idx: Tensor, start: int, config: GPTConfig) -> None:
    """The errors of :meth:`GPT.forward`. Token ids are checked whenever a sequence starts; the tokens
    that continue a cache are the model's own choices and are not checked again (a check costs two
    host synchronisations per token on a GPU)."""
    if idx.dim() != 2 or idx.dtype not in (torch.long, torch.int32):
        raise ValueError(
            f"idx must be integer token ids of shape (B, N), got {idx.dtype} {tuple(idx.shape)}"
        )
    if start + idx.shape[1] > config.block_size:
        raise ValueError(
            f"{start + idx.shape[1]} tokens exceed the context of {config.block_size}; crop "
            "the input (tc.language_models.generate does this for you)"
        )
    if start == 0 and idx.numel() and (idx.min() < 0 or idx.max() >= config.vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {config.vocab_size}), got {idx.min()}..{idx.max()}"
        )


class GPT(nn.Module):
    r"""A decoder-only transformer language model: one forward pass gives every conditional of the
    chain rule, :math:`p(s_{n+1} \mid s_{1:n}) = \operatorname{softmax}(\mathrm{LN}(X^{(L)})
    W_\text{vocab})_n`, and with ``targets`` the mean cross-entropy over all ``B N`` positions.

    Implements: eq-lm-chain, eq-lm-head, eq-lm-loss

    ``forward(idx (B, N), targets (B, N) | None, caches | None) -> (logits (B, N, |V|), loss | None)``.
    With caches (:meth:`new_caches`), ``idx`` holds only the new tokens.
    """

    config_class: type = GPTConfig  # what :meth:`load` rebuilds the config as

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = c = config
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)  # E, (|V|, D)
        self.pos_emb = LearnedPositionalEmbedding(c.block_size, c.d_model)  # R, (C, D)
        self.drop = nn.Dropout(c.dropout)
        self.stack = TransformerStack(  # L causal pre-norm blocks, then a final LayerNorm
            PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu", dropout=c.dropout,
            causal=True,
        )  # fmt: skip
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=False)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight  # W_vocab = E^T (Press & Wolf 2017)
        self.apply(gpt2_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of the residual projections
            if name.endswith(("out_proj.weight", "fc2.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.n_layers))

    def num_params(self) -> int:
        """Parameters, each counted once (a tied LM head is not counted twice)."""
        return sum(p.numel() for p in self.parameters())

    def new_caches(self) -> list[KVCache]:
        """One empty :class:`KVCache` per block, each as long as the context."""
        return [KVCache(self.config.block_size) for _ in range(self.config.n_layers)]

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, caches: list[KVCache] | None = None
    ) -> tuple[Tensor, Tensor | None]:
        start = len(caches[0]) if caches else 0  # positions already in the cache
        _check_token_ids(idx, start, self.config)
        X = self.drop(self.pos_emb(self.tok_emb(idx), start=start))  # (B, N, D)
        X = self.stack(X, caches=caches)  # (B, N, D), final LayerNorm included
        logits = self.lm_head(X)  # (B, N, |V|), eq. (eq-lm-head)
        if targets is None:
            return logits, None
        if targets.shape != idx.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have the shape of idx {tuple(idx.shape)}"
            )
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())  # eq. (eq-lm-loss)
        return logits, loss

    def save(self, path: str | pathlib.Path, **extra) -> None:
        """Save config, weights and any ``extra`` (e.g. the tokenizer's characters) to ``path``,
        atomically (:func:`.checkpoint.atomic_save`: a failed save leaves the old file)."""
        atomic_save(
            {"config": dataclasses.asdict(self.config), "state_dict": self.state_dict(), **extra},
            path,
        )

    @classmethod
    def load(
        cls, path: str | pathlib.Path, map_location: str | torch.device = "cpu"
    ) -> tuple[GPT, dict]:
        """Rebuild a model saved by :meth:`save`; returns ``(model, extra)``."""
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        model = cls(cls.config_class(**ckpt.pop("config")))
        model.load_state_dict(ckpt.pop("state_dict"))
        return model, ckpt


# ---------------------------------------------------------------------------------------------------
# Generation


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
    (Holtzman et al. 2020 discuss why truncation helps). Sampling draws on the CPU from ``generator``,
    so a seed gives the same text on every device.
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


# ---------------------------------------------------------------------------------------------------
# Measuring a language model: perplexity and bits per token


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
    :math:`\exp\big(\frac{1}{N}\sum_n -\log p(t_{n+1} \mid t_{1:n})\big)`, the exponential of the
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


# ---------------------------------------------------------------------------------------------------
# What the heads attend to


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


# ---------------------------------------------------------------------------------------------------
# Baselines: character counts


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


# ---------------------------------------------------------------------------------------------------
# Exposure bias: what teacher forcing hides


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


# ---------------------------------------------------------------------------------------------------
# The recipe: a character-level GPT on tiny-shakespeare


@dataclass(frozen=True)
class LMRecipe(Recipe):
    """How to train a character GPT on tiny-shakespeare (the first 90 % of the text; the validation
    loss is the mean over ``eval_batches`` fixed windows of the last 10 %)."""

    model: GPTConfig = SHAKESPEARE_CPU
    eval_batches: int = 40


SHAKESPEARE_CPU_RECIPE = LMRecipe(
    model=SHAKESPEARE_CPU,
    train=TrainConfig(
        max_steps=1000, lr=8e-3, warmup_steps=100, weight_decay=0.1, eval_interval=250,
        time_budget_s=120.0,
    ),
    batch_size=64,
)  # fmt: skip
"""The CPU target: validation loss <= 1.70 within 120 s of training on 2 cores (``bench/lm.py``).

1,000 steps of 64 windows: about a minute on the 2-core Intel Xeon where it was tuned, so that a machine
half as fast still finishes its schedule inside the budget."""
SHAKESPEARE_GPU_RECIPE = LMRecipe(
    model=SHAKESPEARE_GPU,
    train=TrainConfig(
        max_steps=3000, lr=2e-3, warmup_steps=100, weight_decay=0.1, eval_interval=500,
        time_budget_s=60.0,
    ),
    batch_size=64,
)  # fmt: skip
"""The GPU target: validation loss <= 1.47 within 60 s of training on an H100 (nanoGPT's size)."""


@dataclass
class LMRun:
    """A trained character GPT and what it was trained on."""

    model: GPT
    tokenizer: CharTokenizer
    history: History
    train_ids: Tensor
    val_ids: Tensor

    @property
    def val_loss(self) -> float:
        """The validation loss at the end of training."""
        return self.history.evals["val_loss"][-1]


def train_char_lm(
    recipe: LMRecipe = SHAKESPEARE_CPU_RECIPE,
    device: torch.device | str = "cpu",
    steps: int | None = None,
    seed: int = 0,
    progress: bool = False,
    model_cls: type[GPT] | None = None,
    *,
    checkpoint_path: str | pathlib.Path | None = None,
    checkpoint_every: int | None = None,
    resume_from: str | pathlib.Path | None = None,
) -> LMRun:
    """Train a character GPT on tiny-shakespeare with ``recipe`` (``steps`` shortens it).

    The one training run of chapter 7, its lab and ``bench/lm.py``: the tokenizer is built from the
    whole text, the model is seeded with ``seed``, batches are random windows of the training part.
    ``model_cls`` (default :class:`GPT`) swaps the model class only, e.g. the modern model of
    chapter 13 (:func:`.extensions.train_modern_lm`); split, batches and loop stay the same.

    ``checkpoint_path``, ``checkpoint_every`` and ``resume_from`` go to :func:`.train.train`: the run
    is saved as it goes, and a run resumed from its checkpoint ends exactly as the uninterrupted run
    would have (chapter *Training*). The checkpoint records the recipe, the seed and the model class;
    resuming with another of them is refused.
    """
    model_cls = GPT if model_cls is None else model_cls
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)
    text = tinyshakespeare_text()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode_tensor(text))
    model = model_cls(dataclasses.replace(recipe.model, vocab_size=tok.vocab_size)).to(device)
    C, B = model.config.block_size, recipe.batch_size
    held_out = torch.Generator().manual_seed(1234)
    val_batches = [get_batch(val_ids, C, B, held_out, device) for _ in range(recipe.eval_batches)]

    def loss_fn(m: GPT, batch: tuple[Tensor, Tensor]) -> Tensor:
        return m(*batch)[1]

    def evaluate(m: GPT) -> dict[str, float]:
        return {"val_loss": sum(loss_fn(m, b).item() for b in val_batches) / len(val_batches)}

    train_cfg = dataclasses.replace(recipe.train, seed=seed)
    history = train(
        model,
        lambda g: get_batch(train_ids, C, B, g, device),
        loss_fn,
        train_cfg,
        evaluate,
        progress=progress,
        checkpoint_path=checkpoint_path,
        checkpoint_every=checkpoint_every,
        resume_from=resume_from,
        run_config={"recipe": dataclasses.asdict(recipe), "model_cls": model_cls.__qualname__},
    )
    return LMRun(model, tok, history, train_ids, val_ids)
