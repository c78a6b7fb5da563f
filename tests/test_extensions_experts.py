"""Tests of the mixture-of-experts part of the extensions (``extensions/experts.py``): the sparse
layer equals the loop reference (with and without drops), the capacity rule, the router's weights,
the load-balancing loss, gradients, parameter counts and errors."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer_course.block import MLP
from transformer_course.extensions.experts import (
    MixtureOfExperts,
    capacity_keep,
    expert_capacity,
    load_balancing_loss,
    moe_parameter_counts,
    moe_reference,
    top_k_router,
)
from transformer_course.extensions.gated_mlp import GatedMLP

f64 = torch.float64


def _layer(seed=0, D=8, n_experts=4, k=2, **kwargs):
    torch.manual_seed(seed)
    return MixtureOfExperts(D, n_experts, k=k, d_ff=12, **kwargs).double()


@pytest.mark.parametrize("expert", ["mlp", "gated"])
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("renormalise", [True, False])
def test_sparse_equals_reference_without_drops(expert, k, renormalise):
    torch.manual_seed(0)
    layer = MixtureOfExperts(
        8, 4, k=k, d_ff=12, capacity_factor=None, expert=expert, renormalise=renormalise
    )
    layer = layer.double()
    X = torch.randn(3, 7, 8, dtype=f64)
    out = layer(X)
    Y, dropped = moe_reference(
        X.reshape(-1, 8), layer.W_r.detach(), layer.experts, k, None, renormalise
    )
    assert not dropped.any() and not out.dropped.any()
    assert out.Y.shape == X.shape and out.dropped.shape == (3, 7, k)
    torch.testing.assert_close(out.Y.reshape(-1, 8), Y, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("k", "capacity_factor"), [(1, 0.5), (2, 0.6), (2, 1.0), (3, 0.4)])
def test_sparse_equals_reference_with_drops(k, capacity_factor):
    torch.manual_seed(1)
    layer = MixtureOfExperts(8, 5, k=k, d_ff=12, capacity_factor=capacity_factor).double()
    X = torch.randn(2, 9, 8, dtype=f64) + 0.5  # shifted, so the router is unbalanced
    out = layer(X)
    C = layer.capacity(18)
    assert C == math.ceil(capacity_factor * k * 18 / 5 - 1e-9)
    Y, dropped = moe_reference(X.reshape(-1, 8), layer.W_r.detach(), layer.experts, k, C)
    assert dropped.any(), "the case must drop something to test the rule"
    assert torch.equal(out.dropped.reshape(-1, k), dropped)
    torch.testing.assert_close(out.Y.reshape(-1, 8), Y, atol=1e-10, rtol=0)
    kept = (~out.dropped.reshape(-1, k)).sum()
    assert kept <= C * 5
    # a token whose every choice is dropped leaves the layer as exactly zero
    all_dropped = dropped.all(dim=-1)
    assert torch.equal(
        out.Y.reshape(-1, 8)[all_dropped], torch.zeros(int(all_dropped.sum()), 8, dtype=f64)
    )


def test_dropping_rule_first_choices_then_earlier_tokens():
    # 4 tokens, 3 experts, k = 2; expert 0 is everyone's first choice
    experts = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
    keep = capacity_keep(experts, 3, capacity=2)
    # first choices in token order: t0->0, t1->0 (full), t2->0 dropped, t3->1;
    # second choices: t0->1 (1 has 2 now: full), t1->2, t2->1 dropped, t3->0 dropped
    expected = torch.tensor([[True, True], [True, True], [False, False], [True, False]])
    assert torch.equal(keep, expected)
    # each expert serves at most its capacity
    for i in range(3):
        assert int(((experts == i) & keep).sum()) <= 2
    assert capacity_keep(experts, 3, capacity=4).all()


def test_expert_capacity():
    assert expert_capacity(8, 4, 2, 1.25) == 5  # ceil(1.25 * 2 * 8 / 4) = 5 exactly, not 6
    assert expert_capacity(10, 4, 1, 1.0) == 3  # ceil(2.5)
    assert expert_capacity(12, 3, 1, 1.1) == 5  # ceil(4.4)
    assert expert_capacity(7, 4, 2, None) == 7
    assert expert_capacity(1, 64, 1, 0.1) == 1


def test_router_renormalises_and_matches_softmax_of_kept_logits():
    torch.manual_seed(2)
    X, W_r = torch.randn(11, 6, dtype=f64), torch.randn(6, 5, dtype=f64)
    r = top_k_router(X, W_r, 3)
    torch.testing.assert_close(r.weights.sum(-1), torch.ones(11, dtype=f64), atol=1e-12, rtol=0)
    torch.testing.assert_close(r.probs.sum(-1), torch.ones(11, dtype=f64), atol=1e-12, rtol=0)
    logits = X @ W_r
    kept = logits.gather(1, r.experts)
    torch.testing.assert_close(r.weights, torch.softmax(kept, dim=-1), atol=1e-12, rtol=0)
    assert (r.weights[:, :-1] >= r.weights[:, 1:]).all()  # most probable first
    raw = top_k_router(X, W_r, 3, renormalise=False)
    torch.testing.assert_close(raw.weights, r.probs.gather(1, r.experts), atol=0, rtol=0)
    assert (raw.weights.sum(-1) < 1).all()
    assert torch.equal(raw.experts, r.experts)
    for n in range(11):  # the chosen experts are the k largest probabilities
        assert set(r.experts[n].tolist()) == set(r.probs[n].argsort(descending=True)[:3].tolist())


def _aux_loop(probs, experts, alpha):
    N, n_experts = probs.shape
    k = experts.shape[1]
    total = 0.0
    for i in range(n_experts):
        f_i = sum(1 for n in range(N) for j in range(k) if experts[n, j] == i) / (k * N)
        P_i = sum(probs[n, i].item() for n in range(N)) / N
        total += f_i * P_i
    return alpha * n_experts * total


@pytest.mark.parametrize("k", [1, 2])
def test_aux_loss_equals_its_definition(k):
    torch.manual_seed(3)
    probs = torch.softmax(2 * torch.randn(13, 6, dtype=f64), -1)
    experts = probs.topk(k, -1).indices
    got = load_balancing_loss(probs, experts, alpha=0.01)
    assert abs(got.item() - _aux_loop(probs, experts, 0.01)) < 1e-12


def test_aux_loss_is_alpha_at_balance_and_above_it_when_probabilities_follow_the_load():
    n_experts, alpha = 4, 0.3
    uniform = torch.full((8, n_experts), 1 / n_experts, dtype=f64)
    experts = torch.tensor([[i % 4, (i + 1) % 4] for i in range(8)])  # every expert chosen 4 times
    assert abs(load_balancing_loss(uniform, experts, alpha).item() - alpha) < 1e-12
    # uniform probabilities with any load, or a uniform load with any probabilities: alpha
    skewed = torch.tensor([[0, 1]] * 8)
    assert abs(load_balancing_loss(uniform, skewed, alpha).item() - alpha) < 1e-12
    probs = torch.softmax(torch.randn(8, n_experts, dtype=f64), -1)
    assert abs(load_balancing_loss(probs, experts, alpha).item() - alpha) < 1e-12
    # when the mean probabilities equal the load fractions, the loss is alpha N_e sum f^2 >= alpha
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        f = torch.softmax(torch.randn(n_experts, generator=gen, dtype=f64), 0)
        assert alpha * n_experts * (f * f).sum().item() >= alpha - 1e-12
    # all choices on two experts whose probabilities are high: above alpha
    probs_hot = torch.tensor([[0.45, 0.45, 0.05, 0.05]] * 8, dtype=f64)
    assert load_balancing_loss(probs_hot, skewed, alpha).item() > alpha * 1.5


def test_gradients_reach_the_router():
    layer = _layer(k=2, capacity_factor=None)
    X = torch.randn(4, 5, 8, dtype=f64)
    out = layer(X)
    out.Y.pow(2).sum().backward()
    assert layer.router.weight.grad.abs().sum() > 0  # through the weights rho
    assert all(p.grad is not None for p in layer.experts.parameters())
    # the balancing loss alone also reaches the router
    layer.zero_grad()
    layer(X).aux_loss.backward()
    assert layer.router.weight.grad.abs().sum() > 0
    # k = 1 renormalised: every weight is 1, and the output gives the router no gradient (why Switch
    # keeps the probability)
    for renormalise, nonzero in ((True, False), (False, True)):
        one = _layer(k=1, capacity_factor=None, renormalise=renormalise)
        one(X).Y.pow(2).sum().backward()
        g = one.router.weight.grad
        assert (g is not None and g.abs().max() > 1e-10) == nonzero  # rounding noise aside


@pytest.mark.parametrize("expert", ["mlp", "gated"])
def test_parameter_counts(expert):
    layer = MixtureOfExperts(16, 6, k=2, d_ff=24, expert=expert)
    counts = moe_parameter_counts(16, 24, 6, 2, expert)
    assert counts["total"] == sum(p.numel() for p in layer.parameters())
    assert counts["router"] == layer.router.weight.numel()
    one = MLP(16, 24) if expert == "mlp" else GatedMLP(16, 24)
    assert counts["per_expert"] == sum(p.numel() for p in one.parameters())
    assert counts["active"] == counts["router"] + 2 * counts["per_expert"]
    # the active parameters are those one token's output depends on
    X = torch.randn(1, 16)
    out = layer(X)
    out.Y.sum().backward()
    used = sum(
        p.numel() for p in layer.parameters() if p.grad is not None and p.grad.abs().sum() > 0
    )
    assert used == counts["active"]


def test_experts_reuse_the_course_mlps():
    assert all(type(e) is MLP for e in MixtureOfExperts(8, 3).experts)
    assert all(type(e) is GatedMLP for e in MixtureOfExperts(8, 3, expert="gated").experts)


def test_errors():
    X, W_r = torch.randn(5, 4), torch.randn(4, 3)
    with pytest.raises(ValueError, match="k"):
        top_k_router(X, W_r, 4)
    with pytest.raises(ValueError, match="k"):
        top_k_router(X, W_r, 0)
    with pytest.raises(ValueError, match="W_r"):
        top_k_router(X, W_r.T, 1)
    with pytest.raises(ValueError, match="flatten"):
        top_k_router(X[None], W_r, 1)
    with pytest.raises(ValueError, match="capacity_factor"):
        expert_capacity(5, 3, 1, 0.0)
    with pytest.raises(ValueError, match="capacity_factor"):
        MixtureOfExperts(4, 3, k=1, capacity_factor=-1.0)
    with pytest.raises(ValueError, match="k"):
        MixtureOfExperts(4, 3, k=4)
    with pytest.raises(ValueError, match="expert"):
        MixtureOfExperts(4, 3, expert="moe")
    with pytest.raises(ValueError, match="d_model=4"):
        MixtureOfExperts(4, 3, k=1)(torch.randn(2, 5))
    with pytest.raises(ValueError, match="same N"):
        load_balancing_loss(torch.rand(5, 3), torch.zeros(4, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="k"):
        moe_parameter_counts(4, 8, 3, 5)


def test_layer_is_shape_preserving_and_float32_close():
    torch.manual_seed(4)
    layer = MixtureOfExperts(8, 4, k=2, d_ff=12, capacity_factor=None)
    X = torch.randn(2, 6, 8)
    out = layer(X)
    assert F.one_hot(out.routing.experts, 4).sum(1).max() == 1  # distinct experts per token
    Y32 = out.Y
    Y64, _ = moe_reference(
        X.reshape(-1, 8).double(),
        layer.W_r.detach().double(),
        [e.double() for e in layer.experts],
        2,
    )
    torch.testing.assert_close(Y32.reshape(-1, 8).double(), Y64, atol=1e-5, rtol=0)
