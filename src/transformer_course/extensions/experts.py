r"""Extensions: a sparse mixture-of-experts MLP, its router, its capacity and its balancing loss.

Chapter: *Extensions*, *Going deeper* (Shazeer et al. 2017; Lepikhin et al. 2021, GShard; Fedus et al.
2022, Switch Transformer). The token-wise MLP of a block is replaced by ``N_e`` experts, each one the
course's own MLP (:class:`..block.MLP`, or the gated :class:`.gated_mlp.GatedMLP`), and a router that
sends every token to ``k`` of them:

* :func:`top_k_router`: probabilities ``G = softmax(X W_r)`` over the experts, the ``k`` largest kept,
  their weights renormalised to sum to one (Shazeer et al.; GShard) or left as they are (Switch, whose
  ``k = 1`` weight would otherwise always be 1 and give the router no gradient from the output);
* :func:`expert_capacity` and :func:`capacity_keep`: at most ``C_e = ceil(kappa k N / N_e)`` tokens per
  expert; the rest are dropped, first choices served before second choices, earlier tokens first;
* :class:`MixtureOfExperts`: the sparse layer, which gathers each expert's tokens, runs the expert on
  them only and scatters the weighted results back; a dropped choice contributes nothing, so a token
  whose every choice is dropped leaves the layer as zero (the residual carries it on);
* :func:`moe_reference`: the same layer as a loop over tokens and experts, for the tests and the book;
* :func:`load_balancing_loss`: Switch's auxiliary loss ``alpha N_e sum_i f_i P_i``;
* :func:`moe_parameter_counts`: the parameters a token uses (active) against those the layer stores.

Rows are tokens: the layer flattens any leading dimensions, so a batch ``(B, N, D)`` is routed as
``B N`` tokens together, and the capacity counts them all.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..block import MLP
from ..runtime import shape_of as _shape
from .gated_mlp import GatedMLP

__all__ = [
    "EXPERT_KINDS",
    "MixtureOfExperts",
    "MoEOutput",
    "Routing",
    "capacity_keep",
    "expert_capacity",
    "load_balancing_loss",
    "moe_parameter_counts",
    "moe_reference",
    "top_k_router",
]

EXPERT_KINDS = ("mlp", "gated")  # block.MLP (two matrices, biases) or GatedMLP (three, no biases)


class Routing(NamedTuple):
    """What the router decided for ``N`` tokens and ``N_e`` experts.

    Attributes:
        probs: ``G`` ``(N, N_e)``, the softmax over the experts of each token (rows sum to 1).
        experts: ``(N, k)`` integer, the chosen experts of each token, most probable first.
        weights: ``(N, k)``, the weight ``r`` of each choice (renormalised or not, as asked).
    """

    probs: Tensor
    experts: Tensor
    weights: Tensor


class MoEOutput(NamedTuple):
    """The output of :class:`MixtureOfExperts`.

    Attributes:
        Y: the layer's output, the shape of its input; zero for a token whose choices were all dropped.
        aux_loss: the load-balancing loss (a scalar tensor, differentiable in the router's weights);
            add it to the training loss.
        dropped: ``(..., k)`` boolean, True where a token's choice was dropped for lack of capacity.
        routing: the :class:`Routing` of the flattened tokens.
    """

    Y: Tensor
    aux_loss: Tensor
    dropped: Tensor
    routing: Routing


def _check_k(k: int, n_experts: int) -> None:
    if not 1 <= k <= n_experts:
        raise ValueError(
            f"each token picks k experts among n_experts = {n_experts}, so need 1 <= k <= "
            f"{n_experts}; got k = {k}. Lower k or add experts."
        )


def top_k_router(X: Tensor, W_r: Tensor, k: int, renormalise: bool = True) -> Routing:
    r"""Route each token to its ``k`` most probable experts, book eq. ``eq-ext-moe-router``.

    Implements: eq-ext-moe-router

    .. math:: G = \operatorname{softmax}_\text{row}(X W_r),\quad
              \mathcal{R}_n = \text{the } k_\text{e} \text{ largest entries of row } n,\quad
              \tilde G_{ni} = \frac{G_{ni}}{\sum_{i'\in\mathcal{R}_n} G_{ni'}}\ (i \in \mathcal{R}_n)

    (``k`` is :math:`k_\text{e}`).

    The renormalised weights equal a softmax over the ``k`` kept logits alone (Shazeer et al. 2017
    keep the top ``k`` logits, set the rest to ``-inf`` and take the softmax; GShard divides its two
    gates by their sum). With ``renormalise=False`` the weights are the probabilities ``G_ni``
    themselves, the convention of the Switch Transformer (``k = 1``; renormalising would make its one
    weight 1, and the output would carry no gradient to the router). Shazeer et al.'s noise on the
    logits is left out, and so is GShard's random dispatch of the second choice. Ties between
    probabilities are broken by ``torch.topk``.

    Args:
        X: ``(N, D)`` tokens; W_r: ``(D, N_e)`` the router's map; k: experts per token.

    Raises:
        ValueError: ``X`` is not ``(N, D)``, ``W_r`` is not ``(D, N_e)``, or ``k`` is not in
            ``1 .. N_e``.
    """
    if X.dim() != 2 or W_r.dim() != 2 or W_r.shape[0] != X.shape[-1]:
        raise ValueError(
            f"need tokens X (N, D) and a router map W_r (D, N_e) with the same D; got X {_shape(X)} "
            f"and W_r {_shape(W_r)} (flatten a batch to (B*N, D); W_r is router.weight.T)"
        )
    _check_k(k, W_r.shape[1])
    probs = torch.softmax(X @ W_r, dim=-1)  # (N, N_e), over the experts
    top, experts = probs.topk(k, dim=-1)  # (N, k) each, most probable first
    weights = top / top.sum(dim=-1, keepdim=True) if renormalise else top
    return Routing(probs, experts, weights)


def expert_capacity(
    n_tokens: int, n_experts: int, k: int, capacity_factor: float | None = 1.25
) -> int:
    r"""The most tokens an expert takes, book eq. ``eq-ext-moe-capacity``:
    :math:`C_\text{e} = \lceil \kappa\, k_\text{e} N / N_\text{e} \rceil` (``k`` is :math:`k_\text{e}`),
    ``kappa`` the capacity factor.

    Implements: eq-ext-moe-capacity

    ``k N / N_e`` is an expert's share of the ``k N`` choices when the load is perfectly balanced;
    ``kappa > 1`` leaves room for imbalance (Switch reports values such as 1.0, 1.25 and 2.0).
    ``capacity_factor=None`` means no limit (``C_e = N``: a token picks an expert at most once, so
    nothing is ever dropped).
    The ceiling forgives a rounding error of ``1e-9`` so that an exact product is not rounded up.

    Raises:
        ValueError: ``capacity_factor <= 0``, fewer than one token or expert, or ``k`` not in
            ``1 .. n_experts``.
    """
    if n_tokens < 1 or n_experts < 1:
        raise ValueError(f"need n_tokens >= 1 and n_experts >= 1, got {n_tokens}, {n_experts}")
    _check_k(k, n_experts)
    if capacity_factor is None:
        return n_tokens
    if not capacity_factor > 0:
        raise ValueError(
            f"capacity_factor must be > 0 (1.0 is exactly the balanced share, 1.25 is common), "
            f"got {capacity_factor}; pass None for no limit"
        )
    return max(1, math.ceil(capacity_factor * k * n_tokens / n_experts - 1e-9))


def capacity_keep(experts: Tensor, n_experts: int, capacity: int) -> Tensor:
    """Which choices an expert of ``capacity`` slots can serve: ``(N, k)`` boolean, False = dropped.

    Implements: eq-ext-moe-capacity

    The rule (GShard's order): every token's first choice is served before any second choice, and
    within one rank earlier tokens come first; an expert serves choices until its ``capacity`` slots
    are full and drops the rest. Computed with a running count per expert (a cumulative sum over the
    choices in that order), no loop.

    Args:
        experts: ``(N, k)`` integer, as in :class:`Routing`; n_experts: ``N_e``; capacity: ``C_e``.
    """
    if experts.dim() != 2:
        raise ValueError(f"experts must be (N, k), got {_shape(experts)}")
    if capacity < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity}")
    N, k = experts.shape
    order = experts.T.reshape(-1)  # (k N,): all first choices, then all second choices, ...
    one_hot = F.one_hot(order, n_experts)  # (k N, N_e)
    position = (one_hot.cumsum(dim=0) * one_hot).sum(dim=-1) - 1  # slot each choice would take
    return (position < capacity).reshape(k, N).T  # (N, k)


def load_balancing_loss(probs: Tensor, experts: Tensor, alpha: float = 1.0) -> Tensor:
    r"""Switch's auxiliary load-balancing loss, book eq. ``eq-ext-moe-aux``:

    Implements: eq-ext-moe-aux

    .. math:: \mathcal{L}_\text{aux} = \alpha\, N_\text{e} \sum_{i=1}^{N_\text{e}} f_i\, \bar G_i,\quad
              f_i = \frac{1}{k_\text{e}N}\sum_{n=1}^{N} [\, i \in \mathcal{R}_n \,],\quad
              \bar G_i = \frac1N \sum_{n=1}^{N} G_{ni}

    ``f_i`` is the fraction of the ``k N`` choices that went to expert ``i`` (counted before any
    capacity drop; for ``k = 1`` the fraction of tokens, Fedus et al.'s definition), and ``\bar G_i``
    the mean probability the router gives it (Fedus et al.'s ``P_i``). Only ``\bar G_i`` is
    differentiable. Both sum to 1 over the experts, so the loss is ``alpha`` when either is uniform.

    Args:
        probs: ``G`` ``(N, N_e)``; experts: ``(N, k)`` the chosen experts; alpha: the coefficient.

    Raises:
        ValueError: shapes that do not match.
    """
    if probs.dim() != 2 or experts.dim() != 2 or experts.shape[0] != probs.shape[0]:
        raise ValueError(
            f"need probs (N, N_e) and experts (N, k) with the same N; got {_shape(probs)} and "
            f"{_shape(experts)}"
        )
    N, n_experts = probs.shape
    k = experts.shape[1]
    f = F.one_hot(experts, n_experts).sum(dim=(0, 1)).to(probs.dtype) / (k * N)  # (N_e,)
    P = probs.mean(dim=0)  # (N_e,)
    return alpha * n_experts * (f * P).sum()


class MixtureOfExperts(nn.Module):
    r"""A sparse mixture-of-experts MLP, book eq. ``eq-ext-moe``:

    Implements: eq-ext-moe

    .. math:: \mathbf{y}_n = \sum_{i \in \mathcal{R}_n,\ \text{kept}} \tilde G_{ni}\,
              \mathrm{MLP}_i(\mathbf{x}_n)

    ``forward(X (..., D))`` returns a :class:`MoEOutput`: the output ``Y`` (the input's shape), the
    load-balancing loss (:func:`load_balancing_loss`, coefficient ``alpha``), which choices were
    dropped, and the routing. Each expert is run only on the tokens that chose it and fit in its
    capacity: the choices are sorted by expert, each expert gathers its tokens (``X[tokens]``), and
    the weighted outputs are scattered back with ``index_add_``. Nothing is computed for an expert a
    token did not choose.

    Args:
        d_model: ``D``; n_experts: ``N_e``; k: experts per token; d_ff: each expert's hidden width
            (default ``4 D``); capacity_factor: ``kappa`` (``None``: no limit); expert: ``"mlp"``
            (:class:`..block.MLP` with ``activation``) or ``"gated"`` (:class:`.GatedMLP`, SiLU gate);
            renormalise: see :func:`top_k_router`; alpha: the balancing loss's coefficient
            (Switch uses 0.01).
    """

    def __init__(
        self,
        d_model: int,
        n_experts: int,
        k: int = 2,
        d_ff: int | None = None,
        capacity_factor: float | None = 1.25,
        expert: str = "mlp",
        activation: str = "gelu",
        renormalise: bool = True,
        alpha: float = 0.01,
    ) -> None:
        super().__init__()
        if n_experts < 1:
            raise ValueError(f"need at least one expert, got n_experts = {n_experts}")
        _check_k(k, n_experts)
        expert_capacity(1, n_experts, k, capacity_factor)  # validates capacity_factor
        if expert not in EXPERT_KINDS:
            raise ValueError(f"unknown expert kind {expert!r}; choose one of {EXPERT_KINDS}")
        d_ff = d_ff or 4 * d_model
        self.d_model, self.n_experts, self.k, self.d_ff = d_model, n_experts, k, d_ff
        self.capacity_factor, self.renormalise, self.alpha = capacity_factor, renormalise, alpha
        self.expert_kind = expert
        self.router = nn.Linear(d_model, n_experts, bias=False)  # stores W_r^T
        make = (
            (lambda: MLP(d_model, d_ff, activation))
            if expert == "mlp"
            else (lambda: GatedMLP(d_model, d_ff, "silu"))
        )
        self.experts = nn.ModuleList(make() for _ in range(n_experts))

    @property
    def W_r(self) -> Tensor:
        """The router's map ``(D, N_e)`` in the book's ``X @ W`` convention."""
        return self.router.weight.T

    def capacity(self, n_tokens: int) -> int:
        """``C_e`` for ``n_tokens`` routed together (:func:`expert_capacity`)."""
        return expert_capacity(n_tokens, self.n_experts, self.k, self.capacity_factor)

    def forward(self, X: Tensor) -> MoEOutput:
        if X.dim() < 1 or X.shape[-1] != self.d_model:
            raise ValueError(
                f"MixtureOfExperts(d_model={self.d_model}) needs tokens (..., {self.d_model}), "
                f"got {_shape(X)}"
            )
        flat = X.reshape(-1, self.d_model)  # (N, D), N = all tokens routed together
        N = flat.shape[0]
        routing = top_k_router(flat, self.W_r, self.k, self.renormalise)
        keep = capacity_keep(routing.experts, self.n_experts, self.capacity(N))  # (N, k)
        tokens = torch.arange(N, device=X.device)[:, None].expand(N, self.k)
        expert_ids, token_ids, weights = routing.experts[keep], tokens[keep], routing.weights[keep]
        order = torch.sort(expert_ids, stable=True).indices  # group the kept choices by expert
        counts = torch.bincount(expert_ids, minlength=self.n_experts).tolist()
        Y = torch.zeros_like(flat)
        for expert, t, w in zip(
            self.experts, token_ids[order].split(counts), weights[order].split(counts), strict=True
        ):
            if len(t):  # gather this expert's tokens, run it on them only, scatter back
                Y = Y.index_add(0, t, w[:, None] * expert(flat[t]))
        aux = load_balancing_loss(routing.probs, routing.experts, self.alpha)
        return MoEOutput(Y.reshape(X.shape), aux, (~keep).reshape(*X.shape[:-1], self.k), routing)


def moe_reference(
    X: Tensor,
    W_r: Tensor,
    experts: list[nn.Module] | nn.ModuleList,
    k: int,
    capacity: int | None = None,
    renormalise: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""The mixture-of-experts layer as a loop over tokens and experts: ``(Y (N, D), dropped (N, k))``.

    For each token: its scores ``x_n W_r`` expert by expert, their softmax written out, the ``k``
    largest by sorting, the weights divided by their sum (or not); then the capacity rule as a loop,
    rank by rank and token by token, counting each expert's load; then
    :math:`\mathbf{y}_n = \sum \tilde G_{ni}\,\mathrm{MLP}_i(\mathbf{x}_n)` over the kept choices, each
    expert called on the one token. A check, not an implementation (no marker): it shares no code with
    :class:`MixtureOfExperts` except the experts themselves.
    """
    N, D = X.shape
    n_experts = W_r.shape[1]
    chosen, r = [], []
    for n in range(N):
        scores = [
            sum(X[n, d].item() * W_r[d, i].item() for d in range(D)) for i in range(n_experts)
        ]
        top = max(scores)
        exps = [math.exp(s - top) for s in scores]
        G = [e / sum(exps) for e in exps]
        best = sorted(range(n_experts), key=lambda i: -G[i])[:k]
        total = sum(G[i] for i in best) if renormalise else 1.0
        chosen.append(best)
        r.append([G[i] / total for i in best])
    capacity = N if capacity is None else capacity
    load = [0] * n_experts
    dropped = [[False] * k for _ in range(N)]
    for j in range(k):  # first choices first, then second choices, ...
        for n in range(N):  # ... earlier tokens first
            i = chosen[n][j]
            if load[i] < capacity:
                load[i] += 1
            else:
                dropped[n][j] = True
    Y = torch.zeros(N, D, dtype=X.dtype)
    with torch.no_grad():
        for n in range(N):
            for j in range(k):
                if not dropped[n][j]:
                    Y[n] += r[n][j] * experts[chosen[n][j]](X[n : n + 1])[0]
    return Y, torch.tensor(dropped)


def moe_parameter_counts(
    d_model: int, d_ff: int, n_experts: int, k: int, expert: str = "mlp"
) -> dict[str, int]:
    r"""Parameters of a mixture-of-experts layer, book eq. ``eq-ext-moe-params``:

    Implements: eq-ext-moe-params

    .. math:: \lvert\theta\rvert_\text{total} = D N_\text{e} + N_\text{e}\,\lvert\theta_\text{exp}\rvert,
              \qquad
              \lvert\theta\rvert_\text{active} = D N_\text{e} + k_\text{e}\,\lvert\theta_\text{exp}\rvert

    with ``|theta_exp| = 2 D d_ff + d_ff + D`` for the plain MLP (two matrices, two biases) and
    ``3 D d_ff`` for the gated one. Active parameters are those one token's output depends on: the
    router's and its ``k`` experts' (fewer for a token whose choices are dropped).

    Returns:
        ``{"router": ..., "per_expert": ..., "total": ..., "active": ...}``.
    """
    if expert not in EXPERT_KINDS:
        raise ValueError(f"unknown expert kind {expert!r}; choose one of {EXPERT_KINDS}")
    if min(d_model, d_ff, n_experts) < 1:
        raise ValueError(
            f"need positive sizes, got d_model={d_model}, d_ff={d_ff}, n_experts={n_experts}"
        )
    _check_k(k, n_experts)
    per_expert = 2 * d_model * d_ff + d_ff + d_model if expert == "mlp" else 3 * d_model * d_ff
    router = d_model * n_experts
    return {
        "router": router,
        "per_expert": per_expert,
        "total": router + n_experts * per_expert,
        "active": router + k * per_expert,
    }
