"""Convolutions equal F.conv1d/F.conv2d as sums of shift matrices; the tanh RNN equals nn.RNN and its
Jacobian the chain-rule product; influence decays geometrically with recursion and not with attention;
linear attention's recurrence equals its parallel form; graph attention equals a loop over edges."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import transformer_course as tc
from transformer_course import relations as rel
from transformer_course.exercises import _get, check
from transformer_course.exercises import relations as er

d64 = torch.float64
PADDINGS = ("zeros", "circular", "replicate")
MODES = {"zeros": "constant", "circular": "circular", "replicate": "replicate"}


def torch_conv1d(X, weight, bias=None, padding="zeros"):
    """PyTorch's conv1d with 'same' padding on tokens (..., N, C_in)."""
    J = weight.shape[-1]
    c = (J - 1) // 2
    lead = X.shape[:-2]
    x = X.reshape(-1, *X.shape[-2:]).transpose(-2, -1)  # (B, C_in, N)
    x = F.pad(x, (c, J - 1 - c), mode=MODES[padding])
    return F.conv1d(x, weight, bias).transpose(-2, -1).reshape(*lead, X.shape[-2], -1)


def torch_conv2d(X_img, weight, bias=None, padding="zeros"):
    J_h, J_w = weight.shape[-2:]
    c_h, c_w = (J_h - 1) // 2, (J_w - 1) // 2
    x = F.pad(X_img, (c_w, J_w - 1 - c_w, c_h, J_h - 1 - c_h), mode=MODES[padding])
    return F.conv2d(x, weight, bias)


# ----------------------------------------------------------------------------------------------
# Convolution as attention


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("J", [1, 2, 3, 4, 5])
def test_shift_matrices_follow_their_definition(J, padding):
    N = 6
    Lam = rel.shift_matrices(N, J, padding, dtype=d64)
    c = (J - 1) // 2
    for j in range(J):
        for n in range(N):
            p = n + j - c
            if padding == "zeros":
                target = p if 0 <= p < N else None
            elif padding == "circular":
                target = p % N
            else:
                target = min(max(p, 0), N - 1)
            row = torch.zeros(N, dtype=d64)
            if target is not None:
                row[target] = 1.0
            assert torch.equal(Lam[j, n], row), (j, n)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("J", [1, 2, 3, 4, 5])
def test_conv1d_reference_and_attention_form_equal_torch(J, padding):
    gen = torch.Generator().manual_seed(J)
    X = torch.randn(2, 3, 9, 3, dtype=d64, generator=gen)  # two leading batch dims
    weight = torch.randn(4, 3, J, dtype=d64, generator=gen)
    bias = torch.randn(4, dtype=d64, generator=gen)
    expected = torch_conv1d(X, weight, bias, padding)
    for f in (rel.conv1d_reference, rel.conv1d_as_attention):
        torch.testing.assert_close(f(X, weight, bias, padding), expected, atol=1e-10, rtol=0)
    torch.testing.assert_close(
        rel.conv1d_as_attention(X[0, 0], weight, None, padding),
        torch_conv1d(X[0, 0], weight, None, padding),
        atol=1e-10,
        rtol=0,
    )


def test_conv1d_float32_within_1e5():
    X, weight = torch.randn(2, 12, 5), torch.randn(6, 5, 3)
    torch.testing.assert_close(
        rel.conv1d_as_attention(X, weight), torch_conv1d(X, weight), atol=1e-5, rtol=0
    )


@settings(max_examples=15, deadline=None)
@given(
    N=st.integers(1, 10),
    C_in=st.integers(1, 4),
    C_out=st.integers(1, 4),
    J=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_conv1d_equals_torch_for_any_shape(N, C_in, C_out, J, seed):
    J = min(J, 2 * N - 1)  # zero padding refuses taps that can never touch the sequence
    gen = torch.Generator().manual_seed(seed)
    X = torch.randn(N, C_in, dtype=d64, generator=gen)
    weight = torch.randn(C_out, C_in, J, dtype=d64, generator=gen)
    torch.testing.assert_close(
        rel.conv1d_as_attention(X, weight), torch_conv1d(X, weight), atol=1e-10, rtol=0
    )


def test_channel_matrices_are_the_attention_chapters_toeplitz_matrices():
    weight = torch.randn(3, 2, 4, dtype=d64)
    A = rel.conv1d_attention_matrix(weight, 7)
    assert A.shape == (3, 2, 7, 7)
    for o in range(3):
        for i in range(2):
            torch.testing.assert_close(
                A[o, i], tc.attention.convolution_as_attention(weight[o, i], 7)
            )
    X = torch.randn(7, 2, dtype=d64)
    Y = torch.einsum("oinm,mi->no", A, X)
    torch.testing.assert_close(Y, torch_conv1d(X, weight), atol=1e-12, rtol=0)


@pytest.mark.parametrize("padding", PADDINGS)
def test_flat_matrix_is_the_sum_of_kronecker_products(padding):
    N, weight = 5, torch.randn(2, 3, 3, dtype=d64)
    Lam = rel.shift_matrices(N, 3, padding, dtype=d64)
    big = sum(torch.kron(Lam[j], weight[:, :, j].contiguous()) for j in range(3))
    torch.testing.assert_close(rel.conv1d_flat_matrix(weight, N, padding), big)
    X = torch.randn(N, 3, dtype=d64)
    torch.testing.assert_close(
        (big @ X.reshape(-1)).reshape(N, 2), torch_conv1d(X, weight, None, padding)
    )


@pytest.mark.parametrize(("C_out", "C_in", "J"), [(2, 3, 3), (1, 1, 5), (2, 1, 5), (4, 4, 9)])
def test_fixed_heads_need_at_least_min_J_CinCout(C_out, C_in, J):
    """The rank of the blocks bounds the number of fixed heads (any signed matrices) from below."""
    N = 11
    M = rel.conv1d_flat_matrix(torch.randn(C_out, C_in, J, dtype=d64), N)
    blocks = M.reshape(N, C_out, N, C_in).permute(0, 2, 1, 3).reshape(N * N, C_out * C_in)
    assert int(torch.linalg.matrix_rank(blocks)) == min(J, C_in * C_out)


def test_fewer_channel_pairs_than_taps_the_bound_is_met_by_a_signed_matrix_not_a_softmax_head():
    """One channel, five taps: the bound is 1, met by the kernel's own Toeplitz matrix, which has
    negative entries and rows not summing to one, so no softmax head computes it; the docstring says
    the bound is a lower bound for fixed matrices, not the number of softmax heads a convolution needs
    (issue 22: it used to say "a convolution needs min(J, C_in C_out) heads")."""
    N, w = 9, torch.tensor([[[0.5, -1.0, 2.0, -0.3, 0.7]]], dtype=d64)
    A = rel.conv1d_attention_matrix(w, N)[0, 0]
    X = torch.randn(N, 1, dtype=d64)
    torch.testing.assert_close(A @ X, torch_conv1d(X, w), atol=1e-12, rtol=0)
    assert (A < 0).any() and not torch.allclose(A.sum(-1), torch.ones(N, dtype=d64))
    doc = " ".join(rel.conv1d_flat_matrix.__doc__.split())
    assert "needs :math:`\\min(J, C_\\text{in} C_\\text{out})` heads" not in doc
    assert "at least" in doc and "softmax" in doc


def test_linear_attention_without_the_mask_is_linear_in_N():
    """The causal parallel form forms the N x N matrix, 2 N^2 (d_psi + d_v) FLOPs of products; without
    the mask associativity gives 4 N d_psi d_v + 2 N d_psi."""
    for N in (16, 64):
        Q, K, V = torch.randn(3, N, 8, dtype=d64)
        flops = []
        for causal in (True, False):
            with FlopCounterMode(display=False) as counter:
                rel.linear_attention_parallel(Q, K, V, causal=causal)
            flops.append(counter.get_total_flops())
        assert flops == [2 * N**2 * (8 + 8), 4 * N * 8 * 8 + 2 * N * 8]


def test_masked_softmax_heads_reproduce_a_convolution_exactly():
    N, C_in, C_out, J = 7, 3, 2, 3
    X, weight = torch.randn(N, C_in, dtype=d64), torch.randn(C_out, C_in, J, dtype=d64)
    Lam = rel.shift_matrices(N, J, dtype=d64)
    Q, K = torch.randn(2, J, N, 5, dtype=d64)  # any scores: each row has one key
    heads = tc.scaled_dot_product_attention(Q, K, X.expand(J, N, C_in), mask=Lam != 0)
    Y = sum(heads[j] @ weight[:, :, j].T for j in range(J))
    torch.testing.assert_close(Y, torch_conv1d(X, weight), atol=1e-12, rtol=0)


@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize(("J_h", "J_w"), [(3, 3), (2, 3), (1, 4), (3, 1)])
def test_conv2d_reference_and_attention_form_equal_torch(J_h, J_w, padding):
    X_img = torch.randn(2, 3, 4, 5, dtype=d64)
    weight, bias = torch.randn(2, 3, J_h, J_w, dtype=d64), torch.randn(2, dtype=d64)
    expected = torch_conv2d(X_img, weight, bias, padding)
    for f in (rel.conv2d_reference, rel.conv2d_as_attention):
        torch.testing.assert_close(f(X_img, weight, bias, padding), expected, atol=1e-10, rtol=0)


def test_2d_shifts_are_kronecker_products_that_move_pixels():
    H_px, W_px = 3, 4
    Lam2 = rel.shift_matrices_2d(H_px, W_px, 3, 2, dtype=d64)  # c_h = 1, c_w = 0
    assert Lam2.shape == (6, 12, 12)
    img = torch.arange(12, dtype=d64).reshape(H_px, W_px) + 1
    for p in range(3):
        for q in range(2):
            moved = (Lam2[2 * p + q] @ img.reshape(-1)).reshape(H_px, W_px)
            for i in range(H_px):
                for j in range(W_px):
                    r, s = i + p - 1, j + q
                    inside = 0 <= r < H_px and 0 <= s < W_px
                    assert moved[i, j] == (img[r, s] if inside else 0)


def test_relative_shift_attention_tends_to_the_replicate_shift():
    N, delta = 9, -3
    target = rel.shift_matrices(N, 7, "replicate", dtype=d64)[0]  # Lambda_{-3}
    gaps = [
        float((rel.relative_shift_attention(N, delta, a, dtype=d64) - target).abs().max())
        for a in (0.5, 2.0, 8.0, 32.0)
    ]
    assert all(a > b for a, b in itertools.pairwise(gaps)) and gaps[-1] < 1e-12
    A = rel.relative_shift_attention(N, delta, 0.0)
    torch.testing.assert_close(A, torch.full((N, N), 1.0 / N))  # alpha = 0: uniform
    assert tc.attention.constraint_violations(rel.relative_shift_attention(N, 2, 3.0)) == []


def test_equivariance_of_convolution_and_attention():
    N, D = 8, 3
    X = torch.randn(N, D, dtype=d64)
    shift = rel.shift_matrices(N, 3, "circular", dtype=d64)[2]
    perm = torch.eye(N, dtype=d64)[torch.tensor([3, 0, 6, 1, 7, 2, 5, 4])]
    w = torch.randn(D, D, 3, dtype=d64)

    def conv(Z):
        return rel.conv1d_as_attention(Z, w, padding="circular")

    attn = tc.multihead.SelfAttention(D, 1).double()

    def sa(Z):
        return attn(Z[None])[0]

    with torch.no_grad():
        torch.testing.assert_close(conv(shift @ X), shift @ conv(X))
        assert not torch.allclose(conv(perm @ X), perm @ conv(X))
        for P in (shift, perm):
            torch.testing.assert_close(sa(P @ X), P @ sa(X))


def test_circular_convolution_commutes_with_every_cyclic_shift_and_special_kernels_with_more():
    """relations.md / relations_deeper.md: every power of the shift, not only the shift by one; a
    kernel symmetric in its taps also commutes with the reflection n -> -n mod N, a single tap with every
    permutation; a generic kernel with J > 1 with none of those."""
    N, D = 9, 3
    X = torch.randn(N, D, dtype=d64)
    w = torch.randn(D, D, 3, dtype=d64)
    symmetric = torch.cat([w[..., :2], w[..., :1]], -1)  # F_2 = F_0
    reflection = torch.eye(N, dtype=d64)[(-torch.arange(N)) % N]
    perm = torch.eye(N, dtype=d64)[torch.tensor([3, 0, 6, 1, 7, 2, 5, 4, 8])]

    def conv(kernel):
        return lambda Z: rel.conv1d_as_attention(Z, kernel, padding="circular")

    for delta in range(1, N):
        P = torch.eye(N, dtype=d64).roll(delta, 1)  # Lambda°_delta
        torch.testing.assert_close(conv(w)(P @ X), P @ conv(w)(X))
    torch.testing.assert_close(conv(symmetric)(reflection @ X), reflection @ conv(symmetric)(X))
    assert not torch.allclose(conv(w)(reflection @ X), reflection @ conv(w)(X))
    one_tap = w[..., 1:2]
    torch.testing.assert_close(conv(one_tap)(perm @ X), perm @ conv(one_tap)(X))
    assert not torch.allclose(conv(w)(perm @ X), perm @ conv(w)(X))


def test_convolution_is_local():
    X, w = torch.randn(10, 2, dtype=d64), torch.randn(2, 2, 4, dtype=d64)  # c = 1: reads n-1..n+2
    iota = rel.influence(lambda Z: rel.conv1d_as_attention(Z, w), X, n=4)
    assert (iota[[3, 4, 5, 6]] > 0).all()
    assert (iota[[0, 1, 2, 7, 8, 9]] == 0).all()


# ----------------------------------------------------------------------------------------------
# Recurrent networks


def test_tanh_rnn_reference_equals_nn_rnn_and_the_layer():
    torch.manual_seed(0)
    theirs = nn.RNN(4, 6, batch_first=True).double()
    X = torch.randn(3, 7, 4, dtype=d64)
    W_x, W_z = theirs.weight_ih_l0.detach().T, theirs.weight_hh_l0.detach().T
    b_z = (theirs.bias_ih_l0 + theirs.bias_hh_l0).detach()
    torch.testing.assert_close(
        rel.tanh_rnn_reference(X, W_x, W_z, b_z), theirs(X)[0], atol=1e-12, rtol=0
    )
    ours = rel.TanhRNN(4, 6).double()
    torch.testing.assert_close(
        ours(X), rel.tanh_rnn_reference(X, **ours.weights), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(ours(X[1]), ours(X)[1], atol=1e-12, rtol=0)  # (N, D) too
    z_0 = torch.randn(3, 6, dtype=d64)
    torch.testing.assert_close(
        rel.tanh_rnn_reference(X, W_x, W_z, b_z, z_0),
        theirs(X, z_0[None])[0],
        atol=1e-12,
        rtol=0,
    )


def test_rnn_state_jacobian_is_autograds_and_obeys_the_bound():
    torch.manual_seed(1)
    layer = rel.TanhRNN(3, 5).double()
    X = torch.randn(9, 3, dtype=d64)
    J = rel.rnn_state_jacobian(X, **layer.weights)
    torch.testing.assert_close(J, rel.output_jacobian(layer, X), atol=1e-12, rtol=0)
    w = layer.weights
    z, x = torch.linalg.matrix_norm(w["W_z"], 2), torch.linalg.matrix_norm(w["W_x"], 2)
    for n in range(9):
        assert torch.linalg.matrix_norm(J[n], 2) <= z ** (8 - n) * x * (1 + 1e-12)


def test_influence_matches_finite_differences():
    torch.manual_seed(2)
    attn = tc.multihead.SelfAttention(4, 2).double()

    def f(Z):
        return attn(Z[None])[0]

    X = torch.randn(5, 4, dtype=d64)
    h, fd = 1e-6, torch.zeros(5, dtype=d64)
    with torch.no_grad():
        for m in range(5):
            cols = []
            for e in range(4):
                E = torch.zeros_like(X)
                E[m, e] = h
                cols.append((f(X + E)[2] - f(X - E)[2]) / (2 * h))
            fd[m] = torch.stack(cols).norm()
    torch.testing.assert_close(rel.influence(f, X, n=2), fd, atol=1e-7, rtol=1e-6)


def test_influence_decays_geometrically_for_an_rnn_and_like_1_over_N_for_attention():
    """The monotonicity claims of the chapter's measurement, on a smaller setting."""
    D, lengths = 8, [2, 4, 8, 16, 32]
    N = torch.tensor(lengths, dtype=d64)
    rnn = rel.influence_vs_length(lambda: rel.TanhRNN(D, D), lengths, D, trials=4)
    sa = rel.influence_vs_length(lambda: tc.multihead.SelfAttention(D, 2), lengths, D, trials=4)
    g_rnn, g_sa = rnn.log().mean(0).exp(), sa.log().mean(0).exp()
    assert (g_rnn[1:] < g_rnn[:-1]).all() and g_rnn[0] / g_rnn[-1] > 1e8
    assert (g_sa[1:] < g_sa[:-1]).all() and (N * g_sa).max() / (N * g_sa).min() < 2
    by_dist_rnn = rel.influence_vs_distance(lambda: rel.TanhRNN(D, D), 24, D, trials=4)
    by_dist_sa = rel.influence_vs_distance(lambda: tc.multihead.SelfAttention(D, 2), 24, D, 4)
    d_rnn, d_sa = by_dist_rnn.log().mean(0).exp(), by_dist_sa.log().mean(0).exp()
    assert (d_rnn[1:] > d_rnn[:-1]).all()  # the nearer, the stronger
    assert d_sa[:-1].max() / d_sa[:-1].min() < 3  # no trend with distance


def test_large_recurrent_weights_explode():
    def make():
        layer = rel.TanhRNN(16, 16)
        nn.init.orthogonal_(layer.rnn.weight_hh_l0, gain=3.0)
        return layer

    g = rel.influence_vs_length(make, [4, 16, 48], 16, trials=4).log().mean(0).exp()
    assert (g[1:] > g[:-1]).all() and g[-1] / g[0] > 100


def test_influence_measurements_are_seeded_and_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a = rel.influence_vs_length(lambda: rel.TanhRNN(4, 4), [3, 5], 4, trials=2, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)
    b = rel.influence_vs_length(lambda: rel.TanhRNN(4, 4), [3, 5], 4, trials=2, seed=5)
    torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert rel.influence_vs_distance(lambda: rel.TanhRNN(4, 4), 6, 4, trials=2).shape == (2, 6)


def test_recurrence_depth_grows_with_N_and_attention_depth_does_not():
    layer = rel.TanhRNN(4, 4).double()
    attn = tc.multihead.SelfAttention(4, 2).double()
    depths_rnn, depths_sa = [], []
    for N in (4, 8, 16):
        X = torch.randn(N, 4, dtype=d64, requires_grad=True)
        depths_rnn.append(rel.autograd_depth(rel.tanh_rnn_reference(X, **layer.weights)))
        depths_sa.append(rel.autograd_depth(attn(X[None])))
    assert depths_rnn[2] - depths_rnn[1] == 2 * (depths_rnn[1] - depths_rnn[0]) > 0
    assert len(set(depths_sa)) == 1
    leaf = torch.ones(2, requires_grad=True)
    assert rel.autograd_depth(leaf * 2) == 2  # MulBackward -> AccumulateGrad
    with pytest.raises(ValueError, match="no autograd graph"):
        rel.autograd_depth(torch.ones(2))


# ----------------------------------------------------------------------------------------------
# Linear attention


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_linear_attention_recurrence_equals_parallel_form(dtype):
    gen = torch.Generator().manual_seed(0)
    Q, K = torch.randn(2, 2, 3, 10, 4, generator=gen, dtype=dtype)
    V = torch.randn(2, 3, 10, 5, generator=gen, dtype=dtype)
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(
        rel.linear_attention_recurrent(Q, K, V),
        rel.linear_attention_parallel(Q, K, V),
        atol=tol,
        rtol=tol,
    )


@pytest.mark.parametrize("causal", [True, False])
def test_linear_attention_parallel_equals_its_formula(causal):
    N = 6
    Q, K, V = torch.randn(3, N, 3, dtype=d64)

    def psi(x):
        return F.elu(x) + 1

    Y = torch.zeros(N, 3, dtype=d64)
    for n in range(N):
        ms = range(n + 1) if causal else range(N)
        w = torch.stack([psi(Q[n]) @ psi(K[m]) for m in ms])
        Y[n] = sum(wi * V[m] for wi, m in zip(w, ms, strict=True)) / w.sum()
    torch.testing.assert_close(
        rel.linear_attention_parallel(Q, K, V, causal=causal), Y, atol=1e-12, rtol=0
    )


def test_linear_attention_step_has_a_fixed_state_and_a_fixed_cost():
    r = d_v = 6
    Gamma, zeta = torch.zeros(r, d_v, dtype=d64), torch.zeros(r, dtype=d64)
    for _ in range(20):
        q, k, v = torch.randn(3, 6, dtype=d64)
        with FlopCounterMode(display=False) as counter:
            Gamma, zeta, y = rel.linear_attention_step(Gamma, zeta, q, k, v)
        assert Gamma.shape == (r, d_v) and zeta.shape == (r,) and y.shape == (d_v,)
        assert counter.get_total_flops() == 4 * r * d_v + 2 * r


def test_linear_attention_is_not_softmax_attention():
    Q, K, V = torch.randn(3, 8, 4, dtype=d64)
    soft = tc.scaled_dot_product_attention(Q, K, V, causal=True)
    assert not torch.allclose(rel.linear_attention_parallel(Q, K, V), soft, atol=1e-3)


# ----------------------------------------------------------------------------------------------
# Graphs


def _random_graph(N, E, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, N, (E, 2), generator=gen)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_graph_attention_three_ways_agree(seed):
    N, D = 8, 5
    edges = _random_graph(N, 20, seed)
    edges = edges[edges[:, 1] != 0]  # node 0 receives nothing: a zero output
    gen = torch.Generator().manual_seed(100 + seed)
    X = torch.randn(N, D, dtype=d64, generator=gen)
    W_q, W_k = torch.randn(2, D, 3, dtype=d64, generator=gen)
    W_v = torch.randn(D, 4, dtype=d64, generator=gen)
    Y = rel.graph_attention_loop(X, edges, W_q, W_k, W_v)
    assert (Y[0] == 0).all()
    for f in (rel.graph_attention, rel.graph_attention_edges):
        torch.testing.assert_close(f(X, edges, W_q, W_k, W_v), Y, atol=1e-12, rtol=0)


def test_complete_graph_attention_is_self_attention():
    N, D = 6, 4
    X, W_q, W_k, W_v = torch.randn(N, D, dtype=d64), *torch.randn(3, D, D, dtype=d64)
    complete = rel.edges_of(torch.ones(N, N, dtype=torch.bool))
    assert len(complete) == N * N
    torch.testing.assert_close(
        rel.graph_attention_edges(X, complete, W_q, W_k, W_v),
        tc.self_attention.single_head(X, W_q, W_k, W_v),
        atol=1e-12,
        rtol=0,
    )


def test_adjacency_mask_is_the_transposed_adjacency_matrix():
    edges = torch.tensor([[0, 1], [1, 2], [2, 2], [3, 0]])
    mask = rel.adjacency_mask(edges, 4)
    adjacency = torch.zeros(4, 4, dtype=torch.bool)
    adjacency[edges[:, 0], edges[:, 1]] = True
    assert torch.equal(mask, adjacency.T)
    assert mask[1, 0] and not mask[0, 1]  # 0 -> 1: node 1 attends to node 0
    assert sorted(map(tuple, rel.edges_of(mask).tolist())) == sorted(map(tuple, edges.tolist()))


@pytest.mark.parametrize("causal", [False, True])
def test_window_edges_and_their_count(causal):
    for N in (1, 2, 7, 30):
        for w in (0, 1, 4, 40):
            edges = rel.window_edges(N, w, causal)
            brute = {
                (m, n)
                for n in range(N)
                for m in range(N)
                if abs(n - m) <= w and (m <= n or not causal)
            }
            assert set(map(tuple, edges.tolist())) == brute and len(edges) == len(brute)
            assert rel.window_edge_count(N, w, causal) == len(brute)


def test_strided_edges_are_child_et_als_pattern():
    for N, stride in ((16, 4), (25, 5), (7, 10)):
        edges = rel.strided_edges(N, stride)
        brute = {
            (m, n)
            for n in range(N)
            for m in range(n + 1)
            if n - m <= stride or (n - m) % stride == 0
        }
        assert set(map(tuple, edges.tolist())) == brute and len(edges) == len(brute)
    for N in (256, 1024, 4096):
        per_token = len(rel.strided_edges(N, math.isqrt(N))) / N
        assert 1.4 * math.sqrt(N) < per_token < 1.55 * math.sqrt(N)  # about 1.5 sqrt(N) on average
    last = rel.strided_edges(1024, 32)
    assert (last[:, 1] == 1023).sum() == 32 + 1 + 1023 // 32 - 1  # the last token: about 2 sqrt(N)


def test_gat_layer_equals_its_loop_and_ranks_senders_statically():
    gen = torch.Generator().manual_seed(4)
    N, D, d_v = 7, 4, 3
    X = torch.randn(N, D, dtype=d64, generator=gen)
    W = torch.randn(D, d_v, dtype=d64, generator=gen)
    u_1, u_2 = torch.randn(2, d_v, dtype=d64, generator=gen)
    edges = torch.cat([_random_graph(N, 15, 4), torch.arange(N).repeat(2, 1).T])
    torch.testing.assert_close(
        rel.gat_attention(X, edges, W, u_1, u_2),
        rel.gat_attention_loop(X, edges, W, u_1, u_2),
        atol=1e-12,
        rtol=0,
    )
    e = rel.gat_scores(X, W, u_1, u_2)
    Z = X @ W
    torch.testing.assert_close(
        e, F.leaky_relu((Z @ u_1)[:, None] + (Z @ u_2)[None, :], 0.2), atol=1e-12, rtol=0
    )
    assert (e.argsort(-1) == e[0].argsort()).all()  # static attention (Brody et al. 2022)


# ----------------------------------------------------------------------------------------------
# Errors that speak to the learner


def test_errors_name_the_problem():
    X, weight = torch.randn(6, 3), torch.randn(2, 3, 3)
    with pytest.raises(ValueError, match="C_in=3 input channels but X"):
        rel.conv1d_as_attention(torch.randn(6, 4), weight)
    with pytest.raises(ValueError, match="padding must be one of"):
        rel.conv1d_reference(X, weight, padding="same")
    with pytest.raises(ValueError, match="bias must be"):
        rel.conv1d_as_attention(X, weight, torch.randn(3))
    with pytest.raises(TypeError, match="cast one"):
        rel.conv1d_as_attention(X.double(), weight)
    with pytest.raises(ValueError, match=r"F.conv2d's layout"):
        rel.conv2d_as_attention(torch.randn(3, 4, 4), weight)
    with pytest.raises(ValueError, match="looks transposed"):
        rel.tanh_rnn_reference(
            torch.randn(5, 3), torch.randn(4, 3), torch.randn(4, 4), torch.randn(4)
        )
    with pytest.raises(ValueError, match="alpha must be >= 0"):
        rel.relative_shift_attention(5, 1, -1.0)
    with pytest.raises(ValueError, match="graph has N=4 nodes"):
        rel.adjacency_mask(torch.tensor([[0, 4]]), 4)
    with pytest.raises(TypeError, match="integer node indices"):
        rel.adjacency_mask(torch.tensor([[0.0, 1.0]]), 4)
    with pytest.raises(ValueError, match=r"\(E, 2\)"):
        rel.adjacency_mask(torch.tensor([0, 1]), 4)
    with pytest.raises(ValueError, match="one shape"):
        rel.linear_attention_parallel(torch.randn(5, 3), torch.randn(4, 3), torch.randn(4, 2))
    with pytest.raises(ValueError, match="one sequence"):
        rel.rnn_state_jacobian(torch.randn(2, 5, 3), *torch.randn(3, 3, 3)[:2], torch.randn(3))
    with pytest.raises(ValueError, match="TanhRNN"):
        rel.TanhRNN(3, 4)(torch.randn(5, 4))


def test_conv_signal_in_channels_first_layout_gets_a_hint():
    weight = torch.randn(2, 3, 3)
    with pytest.raises(ValueError, match="transposed to \\(N, C_in\\)"):
        rel.conv1d_as_attention(torch.randn(3, 8), weight)  # (C_in, N) instead of (N, C_in)


def test_functions_follow_their_inputs_device():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    X, weight = torch.randn(5, 2, device=device), torch.randn(3, 2, 3, device=device)
    assert rel.conv1d_as_attention(X, weight).device.type == device
    Q = torch.randn(4, 3, device=device)
    assert rel.linear_attention_recurrent(Q, Q, Q).device.type == device
    edges = rel.window_edges(5, 1).to(device)
    W = torch.randn(2, 2, device=device)
    assert rel.graph_attention_edges(X, edges, W, W, W).device.type == device


# ----------------------------------------------------------------------------------------------
# The exercises


def test_conv_exercise_solution_is_the_package_and_torch():
    ex = _get("relations.conv1d_attention_matrix")
    for trial in range(ex.trials):
        weight, N = ex.make_inputs(torch.Generator().manual_seed(trial), trial)
        A = ex.solution(weight, N)
        torch.testing.assert_close(A, rel.conv1d_attention_matrix(weight, N))
        X = torch.randn(N, weight.shape[1], dtype=d64)
        torch.testing.assert_close(
            torch.einsum("oinm,mi->no", A, X), torch_conv1d(X, weight), atol=1e-12, rtol=0
        )


def test_conv_exercise_mistakes_are_told_apart_on_the_even_trial():
    """Trial 0 has J = 4: the flip, the transpose and both centres give different matrices; with odd J
    the flip equals the transpose and the J // 2 centre equals the right one (so trial 0 must catch
    them)."""
    ex = _get("relations.conv1d_attention_matrix")
    weight, N = ex.make_inputs(torch.Generator().manual_seed(1000), 0)
    assert weight.shape[-1] % 2 == 0
    outs = [ex.solution(weight, N)] + [m.wrong(weight, N) for m in ex.mistakes]
    for i in range(len(outs)):
        for j in range(i):
            assert outs[i].shape != outs[j].shape or not torch.allclose(outs[i], outs[j])
    weight3, N3 = ex.make_inputs(torch.Generator().manual_seed(1001), 1)
    centre_half = next(m for m in ex.mistakes if "J // 2" in m.why)
    torch.testing.assert_close(centre_half.wrong(weight3, N3), ex.solution(weight3, N3))


def test_the_transposed_matrix_is_the_flipped_kernel_only_for_an_odd_J():
    """The exercise's transpose message: A^T has the kernel mirrored, k[n - m + j0], which is the
    flipped kernel for an odd J and the flipped kernel one place off (centred on J // 2) for an even J."""
    for J in (3, 4, 5, 6):
        weight, N, j0 = torch.randn(2, 3, J, dtype=d64), 9, (J - 1) // 2
        transposed = er._toeplitz(weight, N, j0).transpose(-2, -1)
        flipped = er._toeplitz(weight.flip(-1), N, j0)
        if J % 2:
            torch.testing.assert_close(transposed, flipped)
        else:
            assert not torch.allclose(transposed, flipped)
            torch.testing.assert_close(transposed, er._toeplitz(weight.flip(-1), N, J // 2))


def test_linear_exercise_solution_is_the_package():
    ex = _get("relations.linear_attention_recurrent")
    for trial in range(ex.trials):
        Q, K, V = ex.make_inputs(torch.Generator().manual_seed(trial), trial)
        torch.testing.assert_close(ex.solution(Q, K, V), rel.linear_attention_recurrent(Q, K, V))
        torch.testing.assert_close(ex.solution(Q, K, V), rel.linear_attention_parallel(Q, K, V))


def test_graph_exercise_inputs_and_solution():
    ex = _get("relations.graph_attention")
    for trial in range(ex.trials):
        X, edges, W_q, W_k, W_v = ex.make_inputs(torch.Generator().manual_seed(trial), trial)
        N = X.shape[0]
        mask = rel.adjacency_mask(edges, N)
        assert mask.diagonal().all()  # a self-loop on every node: no empty row either way
        assert not torch.equal(mask, mask.T)  # directed: the transposed mask is another graph
        torch.testing.assert_close(
            ex.solution(X, edges, W_q, W_k, W_v), rel.graph_attention(X, edges, W_q, W_k, W_v)
        )


def test_the_labs_demonstrated_mistakes_are_diagnosed():
    def no_normaliser(Q, K, V):
        return er._causal_linear(Q, K, V, normalise=None)

    fb = check("relations.linear_attention_recurrent", no_normaliser)
    assert not fb and "normaliser is missing" in fb.message

    def adjacency_as_mask(X, edges, W_q, W_k, W_v):
        adjacency = torch.zeros(X.shape[0], X.shape[0], dtype=torch.bool)
        adjacency[edges[:, 0], edges[:, 1]] = True
        return tc.self_attention.single_head(X, W_q, W_k, W_v, adjacency)

    fb = check("relations.graph_attention", adjacency_as_mask)
    assert not fb and "mask is transposed" in fb.message


# ----------------------------------------------------------------------------------------------
# Linear attention's kernel view (positive random features) and a gated state


from transformer_course.relations import linear_attention as la  # noqa: E402


def _prf_estimates(q, k, m, seeds):
    """psi(q).psi(k) with m features, one estimate per seed (scale 1: estimates exp(q.k))."""
    out = []
    for s in seeds:
        f = la.positive_random_feature_map(q.shape[-1], m, seed=s, scale=1.0)
        out.append(f(q) @ f(k))
    return torch.stack(out)


def _prf_variance(q, k):
    """The variance of one feature's estimate m psi_j(q) psi_j(k): exp(2 q.k) (exp(|q + k|^2) - 1)."""
    return math.exp(2 * float(q @ k)) * math.expm1(float((q + k) @ (q + k)))


@pytest.mark.parametrize("pair", range(3))
def test_positive_random_features_are_unbiased(pair):
    """Seeded Monte Carlo: the mean of R independent estimates lies within 4 standard errors of
    exp(q.k), the standard error sqrt(Var / (m R)) from the closed-form variance."""
    gen = torch.Generator().manual_seed(pair)
    q, k = 0.5 * torch.randn(2, 4, generator=gen, dtype=d64)
    m, R = 16, 400
    est = _prf_estimates(q, k, m, range(R))
    se = math.sqrt(_prf_variance(q, k) / (m * R))
    assert abs(est.mean().item() - math.exp(q @ k)) < 4 * se
    # features without the -|x|^2/2 term are biased far beyond that tolerance
    f = la.positive_random_feature_map(4, m * R, seed=0, scale=1.0)
    raw = (torch.exp(q @ f.omega.T) @ torch.exp(k @ f.omega.T)) / (m * R)
    assert abs(raw.item() - math.exp(q @ k)) > 10 * se


def test_random_feature_error_falls_as_one_over_sqrt_d_psi():
    gen = torch.Generator().manual_seed(5)
    q, k = 0.5 * torch.randn(2, 4, generator=gen, dtype=d64)
    ms = [4, 16, 64, 256, 1024]
    rms = [
        (_prf_estimates(q, k, m, range(200)) - math.exp(q @ k)).pow(2).mean().sqrt().item()
        for m in ms
    ]
    slope = torch.linalg.lstsq(
        torch.tensor([[math.log(m), 1.0] for m in ms], dtype=d64),
        torch.tensor([math.log(e) for e in rms], dtype=d64)[:, None],
    ).solution[0, 0]
    assert abs(slope.item() + 0.5) < 0.1


@pytest.mark.parametrize("causal", [True, False])
def test_random_feature_attention_approaches_softmax_attention(causal):
    gen = torch.Generator().manual_seed(2)
    Q, K, V = torch.randn(3, 12, 4, generator=gen, dtype=d64)
    soft = tc.scaled_dot_product_attention(Q, K, V, causal=causal)
    errors = []
    for m in (64, 1024, 16384):
        fm = la.positive_random_feature_map(4, m, seed=1)
        Y = la.linear_attention_parallel(Q, K, V, fm, causal=causal)
        errors.append((Y - soft).abs().mean().item())
    assert errors[2] < errors[1] < errors[0] and errors[2] < 0.05
    elu = (la.linear_attention_parallel(Q, K, V, causal=causal) - soft).abs().mean().item()
    assert elu > 2 * errors[2]  # elu + 1 features do not approximate the softmax kernel


def test_positive_random_features_shape_sign_and_seed():
    f = la.positive_random_feature_map(3, 7, seed=4)
    x = torch.randn(2, 5, 3, dtype=d64)
    assert f(x).shape == (2, 5, 7) and (f(x) > 0).all()
    assert f.scale == pytest.approx(3**-0.25)
    torch.testing.assert_close(f.omega, la.positive_random_feature_map(3, 7, seed=4).omega)
    assert not torch.equal(f.omega, la.positive_random_feature_map(3, 7, seed=5).omega)
    # by the formula, entry by entry
    j = 2
    expected = torch.exp(x @ f.omega[j] * f.scale - (x * f.scale).pow(2).sum(-1) / 2) / math.sqrt(7)
    torch.testing.assert_close(f(x)[..., j], expected, atol=1e-12, rtol=1e-12)
    assert f(x.float()).dtype == torch.float32


def _decay_loop(gamma):
    N = gamma.shape[-1]
    D = torch.zeros(N, N, dtype=d64)
    for n in range(N):
        for m in range(n + 1):
            D[n, m] = math.prod(gamma[t].item() for t in range(m + 1, n + 1))
    return D


def test_decay_matrix_equals_the_product_loop():
    gamma = torch.sigmoid(torch.randn(9, dtype=d64))
    D = la.decay_matrix(gamma)
    torch.testing.assert_close(D, _decay_loop(gamma), atol=1e-12, rtol=1e-12)
    assert (D.diagonal() == 1).all() and (D.triu(1) == 0).all()
    n, m = torch.arange(9)[:, None], torch.arange(9)[None, :]
    retnet = la.decay_matrix(torch.full((9,), 0.8, dtype=d64))
    torch.testing.assert_close(
        retnet,
        (torch.tensor(0.8, dtype=d64) ** (n - m).clamp(min=0)) * (m <= n),
        atol=1e-12,
        rtol=0,
    )
    batch = torch.sigmoid(torch.randn(2, 3, 9, dtype=d64))
    torch.testing.assert_close(la.decay_matrix(batch)[1, 2], _decay_loop(batch[1, 2]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("normalise", [True, False])
def test_gated_linear_attention_recurrence_equals_parallel_form(dtype, normalise):
    gen = torch.Generator().manual_seed(3)
    Q, K = torch.randn(2, 2, 3, 16, 4, generator=gen, dtype=dtype)
    V = torch.randn(2, 3, 16, 5, generator=gen, dtype=dtype)
    gates = torch.sigmoid(torch.randn(2, 3, 16, generator=gen, dtype=dtype))
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    fm = la.elu_feature_map if normalise else None  # RetNet/GLA/Mamba-2: identity, no normaliser
    for gamma in (gates, gates[0, 0], 0.9):  # per head and token, shared by the batch, constant
        torch.testing.assert_close(
            la.gated_linear_attention_recurrent(Q, K, V, gamma, fm, normalise),
            la.gated_linear_attention_parallel(Q, K, V, gamma, fm, normalise),
            atol=tol,
            rtol=tol,
        )


def test_gated_linear_attention_equals_its_formula_and_contains_linear_attention():
    N = 7
    Q, K, V = torch.randn(3, N, 3, dtype=d64)
    gamma = torch.sigmoid(torch.randn(N, dtype=d64))
    D = _decay_loop(gamma)
    psi = la.elu_feature_map
    Y = torch.zeros(N, 3, dtype=d64)
    for n in range(N):
        w = torch.stack([D[n, m] * psi(Q[n]) @ psi(K[m]) for m in range(n + 1)])
        Y[n] = sum(w[m] * V[m] for m in range(n + 1)) / w.sum()
    torch.testing.assert_close(
        la.gated_linear_attention_parallel(Q, K, V, gamma), Y, atol=1e-12, rtol=0
    )
    torch.testing.assert_close(
        la.gated_linear_attention_parallel(Q, K, V, 1.0),
        la.linear_attention_parallel(Q, K, V),
        atol=1e-12,
        rtol=0,
    )


def test_gated_step_decays_before_adding():
    q, k, v = torch.randn(3, 4, dtype=d64)
    Gamma, zeta = torch.randn(4, 4, dtype=d64), torch.rand(4, dtype=d64)
    G1, z1, y = la.gated_linear_attention_step(Gamma, zeta, q, k, v, 0.5, normalise=False)
    pk = la.elu_feature_map(k)
    torch.testing.assert_close(G1, 0.5 * Gamma + torch.outer(pk, v))
    torch.testing.assert_close(z1, 0.5 * zeta + pk)
    torch.testing.assert_close(y, la.elu_feature_map(q) @ G1)
    with_one = la.gated_linear_attention_step(Gamma, zeta, q, k, v, 1.0)
    for got, expected in zip(with_one, la.linear_attention_step(Gamma, zeta, q, k, v), strict=True):
        torch.testing.assert_close(got, expected)


def test_a_constant_decay_after_the_update_cancels_in_the_normalised_output():
    """Why the exercise draws one gate per token: with a constant gate the wrong order gives the same
    normalised outputs; with a gate per token it does not."""
    ex = _get("relations.gated_linear_attention")
    after = next(m for m in ex.mistakes if "AFTER" in m.why).wrong
    Q, K, V = torch.randn(3, 6, 3, dtype=d64)
    const = torch.full((6,), 0.7, dtype=d64)
    torch.testing.assert_close(after(Q, K, V, const), ex.solution(Q, K, V, const))
    gates = torch.sigmoid(torch.randn(6, dtype=d64))
    assert not torch.allclose(after(Q, K, V, gates), ex.solution(Q, K, V, gates))


def test_gated_and_random_feature_errors():
    Q = torch.randn(5, 3)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        la.gated_linear_attention_parallel(Q, Q, Q, 1.5)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        la.gated_linear_attention_recurrent(Q, Q, Q, torch.zeros(5))
    with pytest.raises(ValueError, match="one decay per token"):
        la.gated_linear_attention_parallel(Q, Q, Q, torch.full((4,), 0.5))
    with pytest.raises(ValueError, match="floating point decays"):
        la.gated_linear_attention_parallel(Q, Q, Q, torch.ones(5, dtype=torch.long))
    with pytest.raises(ValueError, match="float or a tensor"):
        la.gated_linear_attention_parallel(Q, Q, Q, "0.5")
    with pytest.raises(ValueError, match="one shape"):
        la.gated_linear_attention_parallel(Q, torch.randn(4, 3), Q, 0.5)
    with pytest.raises(ValueError, match="tensor"):
        la.decay_matrix(0.5)
    with pytest.raises(ValueError, match=r"in \(0, 1\]"):
        la.decay_matrix(torch.tensor([0.5, -0.1]))
    with pytest.raises(ValueError, match="width 3"):
        la.positive_random_features(torch.randn(2, 4), torch.randn(8, 3))
    with pytest.raises(ValueError, match=r"\(d_psi, d_k\)"):
        la.positive_random_features(torch.randn(2, 4), torch.randn(8))
    with pytest.raises(ValueError, match="d_psi must be an int"):
        la.positive_random_feature_map(4, 0)
    with pytest.raises(ValueError, match="scale must be > 0"):
        la.positive_random_feature_map(4, 8, scale=0.0)


def test_gated_exercise_solution_is_the_package_and_its_mistakes_differ():
    ex = _get("relations.gated_linear_attention")
    for trial in range(ex.trials):
        args = ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
        expected = ex.solution(*args)
        torch.testing.assert_close(expected, la.gated_linear_attention_recurrent(*args))
        torch.testing.assert_close(expected, la.gated_linear_attention_parallel(*args))
        for mistake in ex.mistakes:
            assert not torch.allclose(mistake.wrong(*args), expected), mistake.why


def test_the_labs_gated_mistakes_are_diagnosed():
    def decay_after_update(Q, K, V, gamma):
        Gamma = torch.zeros(K.shape[1], V.shape[1], dtype=Q.dtype)
        zeta = torch.zeros(K.shape[1], dtype=Q.dtype)
        ys = []
        for t in range(Q.shape[0]):
            Gamma = gamma[t] * (Gamma + torch.outer(F.elu(K[t]) + 1, V[t]))
            zeta = gamma[t] * (zeta + F.elu(K[t]) + 1)
            q = F.elu(Q[t]) + 1
            ys.append((q @ Gamma) / (q @ zeta))
        return torch.stack(ys)

    fb = check("relations.gated_linear_attention", decay_after_update)
    assert not fb and "AFTER adding" in fb.message
