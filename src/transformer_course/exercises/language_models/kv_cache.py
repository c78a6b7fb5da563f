"""Part 9 of lab 7: the key-value cache, the model with caches, and cached generation.

The scratch classes have no cache, so the learner writes the cached versions as subclasses of their own
classes: ``CachedAttention(CausalSelfAttention)`` with ``forward(X, cache=None)``, ``CachedBlock(Block)``
and ``CachedGPT(GPT)`` with ``forward(idx, targets=None, caches=None)``, whose positions continue after
the cached ones. The reference solutions below subclass ``scratch/gpt.py``'s classes the same way: each
cached ``forward`` is a new method, the parameters are the scratch model's. ``generate_cached`` runs the
prompt through the model once, then each new token but the last (the last is chosen, never fed); a
cache cannot slide, so the prompt and every new token but the last must fit in the context
(``T + n - 1 <= block_size``), and it raises a ``ValueError`` up front when they do not.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ...scratch.gpt import GPT, Block, CausalSelfAttention, generate
from .. import Mistake, randn
from .checking import (
    _CONFIGS,
    CapstoneExercise,
    Output,
    _build,
    _close,
    _register,
    _sizes_of,
    _tensor,
    _variant,
    _Verdict,
    lab_state_dict,
    package_gpt,
)
from .generation import _describe_generation, _observe_tokens
from .gpt import _logits_and_loss

# --------------------------------------------------------------------------------------------------
# The cache


class KVCache:
    """Keys and values of the tokens seen so far by one attention layer, (B, H, M, d_k) each."""

    def __init__(self):
        self.K = self.V = None  # nothing cached yet

    def __len__(self):
        return 0 if self.K is None else self.K.shape[2]  # M, the positions cached

    def update(self, K_new, V_new):
        if self.K is None:
            self.K, self.V = K_new, V_new
        else:
            self.K = torch.cat([self.K, K_new], dim=2)  # (B, H, M + n, d_k): along the positions
            self.V = torch.cat([self.V, V_new], dim=2)
        return self.K, self.V


class _Cache(KVCache):
    """Wrong caches: one attribute per mistake."""

    axis = 2  # the axis the cache grows along
    returns_all = keeps = True
    counts_updates = keys_twice = new_first = False

    def __init__(self):
        super().__init__()
        self.updates = 0

    def __len__(self):
        return self.updates if self.counts_updates else super().__len__()

    def update(self, K_new, V_new):
        self.updates += 1
        if self.K is None or not self.keeps:
            self.K, self.V = K_new, V_new
        else:
            if self.new_first:
                self.K = torch.cat([K_new, self.K], dim=self.axis)
                self.V = torch.cat([V_new, self.V], dim=self.axis)
            else:
                self.K = torch.cat([self.K, K_new], dim=self.axis)
                self.V = torch.cat([self.V, V_new], dim=self.axis)
        K, V = (self.K, self.V) if self.returns_all else (K_new, V_new)
        return (K, K) if self.keys_twice else (K, V)


WHY_CACHE_HEADS_AXIS = (
    "you concatenated along the heads (dim=1); the cache grows along the positions, dim=2 of "
    "(B, H, M, d_k)."
)
WHY_CACHE_ONLY_NEW = (
    "update returned only the new keys and values; it returns every position so far, the cached "
    "ones followed by the new ones."
)
WHY_CACHE_COUNTS_UPDATES = (
    "len(cache) counts your calls to update; it is the number of positions cached (a prompt of 3 "
    "tokens adds 3), which CachedGPT.forward uses as the next position."
)
WHY_CACHE_KEYS_TWICE = "update returned the keys twice; return (K, V)."
WHY_CACHE_NEW_FIRST = (
    "you put the new keys and values before the cached ones; the earlier positions come first, "
    "torch.cat([old, new], dim=2)."
)
WHY_CACHE_OVERWRITES = (
    "your cache keeps only the latest update: concatenate the new keys and values to the cached ones "
    "instead of replacing them."
)
CACHE_MISTAKES = [
    Mistake(WHY_CACHE_HEADS_AXIS, _variant(_Cache, "_HeadsAxis", axis=1)),
    Mistake(WHY_CACHE_ONLY_NEW, _variant(_Cache, "_OnlyNew", returns_all=False)),
    Mistake(WHY_CACHE_COUNTS_UPDATES, _variant(_Cache, "_CountsUpdates", counts_updates=True)),
    Mistake(WHY_CACHE_KEYS_TWICE, _variant(_Cache, "_KeysTwice", keys_twice=True)),
    Mistake(WHY_CACHE_NEW_FIRST, _variant(_Cache, "_NewFirst", new_first=True)),
    Mistake(WHY_CACHE_OVERWRITES, _variant(_Cache, "_Overwrites", keeps=False)),
]


def _observe_cache(answer: Any, case: tuple) -> Output:
    B, H, d_k, chunks = case
    g = torch.Generator().manual_seed(60)
    cache = answer()
    lengths, out = [len(cache)], {}
    for k, n in enumerate(chunks):
        K, V = cache.update(randn(g, B, H, n, d_k), randn(g, B, H, n, d_k))
        out[f"K after update {k + 1}"] = _tensor(K, "update")
        out[f"V after update {k + 1}"] = _tensor(V, "update")
        lengths.append(len(cache))
    return {"len(cache) before and after each update": torch.tensor(lengths), **out}


_register(
    CapstoneExercise(
        name="language_models.kv_cache",
        prompt=(
            "Write the class KVCache(): update(K_new, V_new), with the new tokens' keys and values "
            "(B, H, n, d_k), appends them after the cached ones and returns all keys and values so "
            "far, (B, H, M, d_k) each; len(cache) is M, the number of positions cached."
        ),
        solution=KVCache,
        mistakes=CACHE_MISTAKES,
        cases=lambda: [(2, 3, 4, (3, 1, 2))],
        observe=_observe_cache,
        describe=lambda case: (
            f"case: B={case[0]}, H={case[1]}, d_k={case[2]}; updates of {case[3]} tokens"
        ),
        atol=0.0,
        rtol=0.0,
        passed="matches the reference cache",
        registered_by=__name__,
    )
)


# --------------------------------------------------------------------------------------------------
# The model with caches: subclasses of the scratch classes, each with a cached forward


class CachedAttention(CausalSelfAttention):
    """CausalSelfAttention with a key-value cache: X holds the N newest tokens only, and the keys and
    values of the M positions so far come from cache.update."""

    def forward(self, X, cache=None):
        B, N, D = X.shape
        Q = self.W_q(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        K = self.W_k(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        V = self.W_v(X).view(B, N, self.H, self.d_k).transpose(1, 2)  # (B, H, N, d_k)
        if cache is not None:
            K, V = cache.update(K, V)  # (B, H, M, d_k): the earlier positions, then the new ones
        M = K.shape[2]
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, N, M): new queries, all keys
        # query n sits at position M - N + n: it may see the keys m <= M - N + n
        future = torch.ones(N, M, dtype=torch.bool, device=X.device).triu(M - N + 1)
        A = self.drop(torch.softmax(S.masked_fill(future, float("-inf")), dim=-1))
        Y = (A @ V).transpose(1, 2).reshape(B, N, D)  # (B, N, D): the heads side by side
        return self.W_o(Y)


class CachedBlock(Block):
    """Block whose attention takes a cache: the same parameters, forward(X, cache=None)."""

    def __init__(self, config):
        super().__init__(config)
        self.attn = CachedAttention(config)

    def forward(self, X, cache=None):
        Z = X + self.drop(self.attn(self.norm1(X), cache))  # (B, N, D)
        return Z + self.drop(self.mlp(self.norm2(Z)))  # (B, N, D)


class CachedGPT(GPT):
    """GPT with one KVCache per block: given caches, idx holds only the new tokens, whose positions
    continue after the len(caches[0]) positions already cached."""

    def __init__(self, config):
        super().__init__(config)
        blocks = nn.ModuleList([CachedBlock(config) for _ in range(config.n_layers)])
        blocks.load_state_dict(self.blocks.state_dict())  # keep the initialised weights
        self.blocks = blocks

    def forward(self, idx, targets=None, caches=None):
        start = len(caches[0]) if caches else 0  # positions already cached
        N = idx.shape[1]
        positions = torch.arange(start, start + N, device=idx.device)  # start, ..., start + N - 1
        X = self.drop(self.embed.tok_emb(idx) + self.embed.pos_emb(positions))  # (B, N, D)
        for ell, block in enumerate(self.blocks):
            X = block(X, None if caches is None else caches[ell])  # (B, N, D)
        logits = self.lm_head(self.final_norm(X))  # (B, N, V)
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class _CachedAttention(CachedAttention):
    """Wrong cached attention layers: one attribute per mistake."""

    mask = "offset"  # "top_left", "square" (N x N), "none_with_cache"
    uses_cache = True
    update_after_scores = False

    def forward(self, X, cache=None):
        B, N, D = X.shape
        Q, K, V = (
            W(X).view(B, N, self.H, self.d_k).transpose(1, 2)
            for W in (self.W_q, self.W_k, self.W_v)
        )
        updates = cache is not None and self.uses_cache
        if updates and not self.update_after_scores:
            K, V = cache.update(K, V)
        S = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        if updates and self.update_after_scores:
            K, V = cache.update(K, V)
        M = K.shape[2]
        ones = torch.ones(N, M, dtype=torch.bool, device=X.device)
        mask = "offset" if cache is None else self.mask
        hidden = {
            "offset": ones.triu(M - N + 1),
            "top_left": ones.triu(1),  # what F.scaled_dot_product_attention(is_causal=True) does
            "square": torch.ones(N, N, dtype=torch.bool, device=X.device).triu(1),
            "none_with_cache": ~ones,
        }[mask]
        A = torch.softmax(S.masked_fill(hidden, float("-inf")), dim=-1)
        return self.W_o((A @ V).transpose(1, 2).reshape(B, N, D))


class _CachedGPT(CachedGPT):
    """Wrong cached models: one attribute per mistake, or a wrong cached attention swapped in."""

    restarts_positions = one_cache = False
    attention: type | None = None

    def __init__(self, config):
        super().__init__(config)
        for block in self.blocks:
            if self.attention is not None:
                block.attn.__class__ = self.attention

    def forward(self, idx, targets=None, caches=None):
        start = len(caches[0]) if caches and not self.restarts_positions else 0
        positions = torch.arange(start, start + idx.shape[1], device=idx.device)
        X = self.embed.tok_emb(idx) + self.embed.pos_emb(positions)
        for ell, block in enumerate(self.blocks):
            X = block(X, None if caches is None else caches[0 if self.one_cache else ell])
        return self.lm_head(self.final_norm(X)), None


def _with(name: str, **attrs: Any) -> type:
    return _variant(_CachedGPT, name, attention=_variant(_CachedAttention, name + "Attn", **attrs))


WHY_POSITIONS_RESTART = (
    "your positions restart at 0 at every call: with caches the N new tokens sit at positions "
    "len(caches[0]), ..., len(caches[0]) + N - 1, so add R[len(caches[0]) + n], not R[n]."
)
WHY_MASK_NOT_OFFSET = (
    "with a cache your causal mask starts at the first key instead of ending at the last: the N new "
    "queries are the last N of the M positions, so query n may see the keys m <= M - N + n (mask "
    "torch.ones(N, M).triu(M - N + 1)). F.scaled_dot_product_attention(is_causal=True) aligns its "
    "mask to the top left and makes this mistake whenever N != M."
)
WHY_IGNORES_CACHE = (
    "your attention ignores the cache: call K, V = cache.update(K, V) after computing the new tokens' "
    "keys and values, so that the queries also see the earlier tokens."
)
WHY_NO_MASK_WITH_CACHE = (
    "with a cache you dropped the causal mask, but a prompt goes through in one piece: its tokens "
    "must not see the ones after them (only a single new token needs no mask)."
)
WHY_ONE_CACHE = (
    "every block used the same cache; each block caches its own keys and values: pass caches[l] to "
    "block l."
)
WHY_SQUARE_MASK = (
    "with a cache your mask is still (N, N), but the scores are (B, H, N, M): the N new queries against "
    "the keys of all M positions so far. Build the mask (N, M), torch.ones(N, M).triu(M - N + 1) "
    "(query n sits at position M - N + n)."
)
WHY_UPDATE_AFTER_SCORES = (
    "you called cache.update after computing the scores: they cover only the N new keys, (B, H, N, N), "
    "while the mask and the values cover all M positions, and masked_fill fails on the shapes. Call "
    "K, V = cache.update(K, V) right after computing the new keys and values, before the scores."
)
WHY_CACHED_SHAPES = (
    "(Your model runs without caches and fails with them.) With a cache the N new queries meet the keys "
    "of all M >= N positions: compute the scores after K, V = cache.update(K, V), so that they are "
    "(B, H, N, M), and mask them with an (N, M) mask, torch.ones(N, M).triu(M - N + 1)."
)
CACHED_MISTAKES = [
    Mistake(WHY_POSITIONS_RESTART, _variant(_CachedGPT, "_Restarts", restarts_positions=True)),
    Mistake(WHY_MASK_NOT_OFFSET, _with("_TopLeft", mask="top_left")),
    Mistake(WHY_IGNORES_CACHE, _with("_NoCache", uses_cache=False)),
    Mistake(WHY_NO_MASK_WITH_CACHE, _with("_NoMaskCached", mask="none_with_cache")),
    Mistake(WHY_ONE_CACHE, _variant(_CachedGPT, "_OneCache", one_cache=True), "raises"),
    Mistake(WHY_SQUARE_MASK, _with("_SquareMask", mask="square"), "raises"),
    Mistake(WHY_UPDATE_AFTER_SCORES, _with("_UpdateLate", update_after_scores=True), "raises"),
]


def _cached_cases() -> list:
    cases = []
    for k, (config, chunks) in enumerate(zip(_CONFIGS, ((3, 1, 2, 1, 2), (3, 1, 2)), strict=True)):
        g = torch.Generator().manual_seed(70 + k)
        cases.append(
            (config, torch.randint(config.vocab_size, (2, sum(chunks)), generator=g), chunks)
        )
    return cases


_FED = "the logits, fed piece by piece through the caches"


def _observe_cached(answer: Any, case: tuple) -> Output:
    config, idx, chunks = case
    model = _build(answer, config, lab_state_dict(package_gpt(config)), "CachedGPT")
    with torch.no_grad():
        whole = _logits_and_loss(model(idx))[0]
        if not _close(whole, package_gpt(config)(idx)[0]):
            raise _Verdict(
                "without caches your model's logits already differ from the package's: pass "
                "language_models.gpt first (CachedGPT keeps GPT's parameters and, without caches, "
                "its output)."
            )
        caches = [KVCache() for _ in range(config.n_layers)]  # the reference cache
        pieces, start = [], 0
        try:
            for n in chunks:
                pieces.append(_logits_and_loss(model(idx[:, start : start + n], caches=caches))[0])
                start += n
        except Exception as err:
            err.in_cached_pass = True  # for the advice
            raise
    return {_FED: torch.cat(pieces, dim=1)}


def _expected_cached(case: tuple) -> Output:
    config, idx, _ = case
    with torch.no_grad():
        return {_FED: package_gpt(config)(idx)[0]}


def _advise_cached(err: BaseException, case: tuple) -> str | None:
    shapes = isinstance(err, RuntimeError) and getattr(err, "in_cached_pass", False)
    return WHY_CACHED_SHAPES if shapes else None


_register(
    CapstoneExercise(
        name="language_models.gpt_cached",
        prompt=(
            "Write CachedAttention(CausalSelfAttention), CachedBlock(Block) and CachedGPT(GPT), your "
            "classes with caches: given one KVCache per block, CachedGPT.forward(idx, caches=caches) "
            "takes only the new tokens, places them at positions len(caches[0]) onwards, and each "
            "attention layer appends their keys and values to its cache and lets the new queries "
            "attend to every position up to their own; fed piece by piece, the logits equal one "
            "pass over the whole sequence."
        ),
        solution=CachedGPT,
        helpers=(CachedAttention, CachedBlock),
        mistakes=CACHED_MISTAKES,
        cases=_cached_cases,
        observe=_observe_cached,
        expected=_expected_cached,
        advice=_advise_cached,
        describe=lambda case: f"case: {_sizes_of(case[0])}; pieces of {case[2]} tokens",
        example="CachedGPT",
        atol=1e-6,
        rtol=1e-6,
        passed="fed piece by piece through a cache, the logits equal one uncached pass",
        registered_by=__name__,
    )
)


# --------------------------------------------------------------------------------------------------
# Cached generation


def generate_cached(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
    """As `generate`, with a KVCache per block: the prompt goes through once, then one token a step."""
    # the model sees the prompt and every new token but the last (chosen, never fed): T + n - 1 tokens
    if idx.shape[1] + max_new_tokens - 1 > model.config.block_size:
        raise ValueError(
            f"{idx.shape[1]} + {max_new_tokens} - 1 tokens do not fit in the context of "
            f"{model.config.block_size}: a cache cannot slide (the package's generate restarts it)"
        )
    model.eval()  # no dropout
    caches = [KVCache() for _ in range(model.config.n_layers)]
    with torch.no_grad():
        logits = model(idx, caches=caches)[0][:, -1]  # the whole prompt, once: (B, V)
        for step in range(max_new_tokens):
            if greedy:
                nxt = logits.argmax(dim=-1, keepdim=True)  # (B, 1)
            else:
                probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
                nxt = torch.multinomial(probs, 1, generator=generator)  # (B, 1)
            idx = torch.cat([idx, nxt], dim=1)
            if step < max_new_tokens - 1:  # the last token is chosen: no pass on it
                logits = model(nxt, caches=caches)[0][:, -1]  # only the newest token goes through
    return idx


def _wrong_cached(
    feed="new", use_caches=True, first=False, shared=False, checks=True, last_pass=False
) -> Callable:
    """Cached generation with one typical mistake (``checks="strict"``: refuses T + n > C, as if the
    last token were fed too)."""

    def wrong(model, idx, max_new_tokens, temperature=1.0, greedy=False, generator=None):
        needed = idx.shape[1] + max_new_tokens - (0 if checks == "strict" else 1)
        if checks and needed > model.config.block_size:
            raise ValueError("the tokens do not fit in the context")
        n_layers = model.config.n_layers
        caches = [KVCache()] * n_layers if shared else [KVCache() for _ in range(n_layers)]
        with torch.no_grad():
            logits = model(idx, caches=caches)[0][:, 0 if first else -1]
            for step in range(max_new_tokens):
                if greedy:
                    nxt = logits.argmax(dim=-1, keepdim=True)
                else:
                    nxt = torch.multinomial(
                        torch.softmax(logits / temperature, dim=-1), 1, generator=generator
                    )
                idx = torch.cat([idx, nxt], dim=1)
                if step == max_new_tokens - 1 and not last_pass:
                    break  # the last token is chosen, not fed
                fed = {"new": nxt, "all": idx, "previous": idx[:, -2:-1]}[feed]
                logits = model(fed, caches=caches if use_caches else None)[0][:, -1]
        return idx

    return wrong


WHY_CACHED_RESENDS = (
    "with a cache, feed only the new token after the prompt: you ran the whole sequence through the "
    "model again, so its keys and values were cached twice."
)
WHY_CACHED_NO_CACHES = (
    "after the prompt you ran the newest token through the model without the caches, so it saw one "
    "token of context; pass caches=caches at every step."
)
WHY_CACHED_FIRST_POSITION = (
    "the first new token was chosen from the first position of the prompt's logits; use the last "
    "position, logits[:, -1]."
)
WHY_CACHED_PREVIOUS_TOKEN = (
    "after appending the chosen token you fed the token before it; feed the new token, idx[:, -1:]."
)
WHY_CACHED_SHARED = (
    "`[KVCache()] * n_layers` is one cache shared by every block (the list holds the same object "
    "n_layers times); build one per block, [KVCache() for _ in range(n_layers)]."
)
WHY_CACHED_NO_CONTEXT_CHECK = (
    "asked for more tokens than the context holds (prompt + new tokens > block_size), your "
    "generate_cached must raise a ValueError before it starts: a cache cannot slide, and the positions "
    "end at block_size. The model sees the prompt and every new token but the last, so check "
    "idx.shape[1] + max_new_tokens - 1 <= model.config.block_size first."
)
WHY_CACHED_LAST_PASS = (
    "after choosing the last new token you ran the model on it once more: its logits are never used, "
    "and its position, the (T + n)-th, lies past the context when the request just fits "
    "(T + n - 1 = block_size). Stop once the last token is appended (or break before feeding it)."
)
WHY_CACHED_CHECK_TOO_STRICT = (
    "you raised a ValueError for a request that fits: the model sees the prompt and every new token "
    "but the last, which is chosen and never fed, so T + n - 1 <= block_size tokens are enough. "
    "Raise only when idx.shape[1] + max_new_tokens - 1 > model.config.block_size, and run no pass on "
    "the last token."
)
GENERATE_CACHED_MISTAKES = [
    Mistake(WHY_CACHED_RESENDS, _wrong_cached(feed="all")),
    Mistake(WHY_CACHED_NO_CACHES, _wrong_cached(use_caches=False)),
    Mistake(WHY_CACHED_FIRST_POSITION, _wrong_cached(first=True)),
    Mistake(WHY_CACHED_PREVIOUS_TOKEN, _wrong_cached(feed="previous")),
    Mistake(WHY_CACHED_SHARED, _wrong_cached(shared=True)),
    Mistake(WHY_CACHED_NO_CONTEXT_CHECK, _wrong_cached(checks=False)),
    Mistake(WHY_CACHED_LAST_PASS, _wrong_cached(last_pass=True), "raises"),
    Mistake(WHY_CACHED_CHECK_TOO_STRICT, _wrong_cached(checks="strict"), "raises"),
]


def _generate_cached_cases() -> list:
    c0, c1 = _CONFIGS
    g = torch.Generator().manual_seed(80)
    return [  # the first request just fits: T + n - 1 = C (the last token is never fed)
        (c0, torch.randint(c0.vocab_size, (2, 3), generator=g), c0.block_size - 2, {"greedy": True}),
        (c1, torch.randint(c1.vocab_size, (2, 2), generator=g), c1.block_size - 2,
         {"temperature": 0.8, "seed": 3}),
        (c0, torch.randint(c0.vocab_size, (1, 3), generator=g), c0.block_size - 1,
         {"greedy": True, "too_long": True}),
    ]  # fmt: skip


def _observe_generate_cached(answer: Any, case: tuple) -> Output:
    """The tokens, generated with the package's GPT (which takes ``caches=`` too); for a request
    longer than the context, whether a ``ValueError`` came before the model ran (the package's GPT
    raises one of its own when the positions run out: that one does not count). A request that fits
    but is refused before the model runs, or that runs past the context on a pass after the last
    token (the ``n + 1``-th), is named here: its error says nothing else."""
    config, idx, n, options = case
    model = copy.deepcopy(package_gpt(config))  # the answer may change its mode
    calls = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    if not options.get("too_long"):
        try:
            return _observe_tokens(answer, case, model)
        except ValueError:
            if not calls:  # refused before the model ran: a request that fits
                raise _Verdict(WHY_CACHED_CHECK_TOO_STRICT) from None
            if len(calls) == n + 1:  # the prompt, n - 1 new tokens, and a pass on the last one
                raise _Verdict(WHY_CACHED_LAST_PASS) from None
            raise
    try:
        answer(model, idx.clone(), n, greedy=True)
    except ValueError:
        if not calls:
            return {"a ValueError": torch.tensor(True)}
    raise _Verdict(WHY_CACHED_NO_CONTEXT_CHECK)


def _expected_generate_cached(case: tuple) -> Output:
    """Without a cache, the same tokens: the reference `generate` (for a too long request, an error)."""
    config, _, _, options = case
    if options.get("too_long"):
        return {"a ValueError": torch.tensor(True)}
    return _observe_tokens(generate, case, copy.deepcopy(package_gpt(config)))


def _advise_generate_cached(err: BaseException, case: tuple) -> str | None:
    return WHY_CACHED_NO_CONTEXT_CHECK if case[3].get("too_long") else None


_register(
    CapstoneExercise(
        name="language_models.generate_cached",
        prompt=(
            "Write generate_cached(model, idx, max_new_tokens, temperature=1.0, greedy=False, "
            "generator=None), generate with one KVCache per block: the prompt goes through the model "
            "once, then only each new token; the tokens equal those of generate without a cache. "
            "Prompt and new tokens must fit in the context: raise a ValueError first if they do not."
        ),
        solution=generate_cached,
        mistakes=GENERATE_CACHED_MISTAKES,
        cases=_generate_cached_cases,
        observe=_observe_generate_cached,
        expected=_expected_generate_cached,
        advice=_advise_generate_cached,
        describe=_describe_generation,
        kind="function",
        atol=0.0,
        rtol=0.0,
        passed="the same tokens as generation without a cache, and a ValueError past the context,",
        registered_by=__name__,
    )
)
