"""Chapter *Multi-head self-attention*: reference (loop over heads) == SelfAttention ==
torch.nn.MultiheadAttention, causal layers, the one attention function, the exercises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course.exercises import multihead as mh
from transformer_course.multihead import (
    SelfAttention,
    merge_heads,
    multi_head_attention,
    multi_head_attention_reference,
    split_heads,
)
from transformer_course.self_attention import causal_mask

# ----------------------------------------------------------------------------------------------
# The layer

TOL = {torch.float64: dict(atol=1e-10, rtol=0), torch.float32: dict(atol=1e-5, rtol=1e-5)}


def _pair(D, H, dtype, bias=True, seed=0):
    torch.manual_seed(seed)
    ours = SelfAttention(D, H, bias=bias).to(dtype)
    theirs = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).to(dtype)
    ours.load_from_torch(theirs)
    return ours, theirs


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize(
    ("B", "N", "D", "H"), [(1, 1, 4, 1), (2, 5, 8, 2), (3, 7, 12, 4), (2, 6, 16, 16)]
)
@pytest.mark.parametrize("masked", [False, True])
def test_module_equals_torch_outputs_and_gradients(dtype, B, N, D, H, masked):
    ours, theirs = _pair(D, H, dtype)
    X = torch.randn(B, N, D, dtype=dtype, requires_grad=True)
    X2 = X.detach().clone().requires_grad_(True)
    mask = causal_mask(N) if masked else None
    Y = ours(X, mask=mask)
    Y_t, _ = theirs(X2, X2, X2, attn_mask=None if mask is None else ~mask, need_weights=False)
    torch.testing.assert_close(Y, Y_t, **TOL[dtype])
    g = torch.randn_like(Y)
    Y.backward(g)
    Y_t.backward(g)
    torch.testing.assert_close(X.grad, X2.grad, **TOL[dtype])
    torch.testing.assert_close(ours.in_proj.weight.grad, theirs.in_proj_weight.grad, **TOL[dtype])
    torch.testing.assert_close(ours.out_proj.weight.grad, theirs.out_proj.weight.grad, **TOL[dtype])
    torch.testing.assert_close(ours.in_proj.bias.grad, theirs.in_proj_bias.grad, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reference_equals_module(dtype):
    torch.manual_seed(1)
    mha = SelfAttention(12, 3, bias=False).to(dtype)
    X = torch.randn(2, 5, 12, dtype=dtype)
    mask = torch.rand(2, 5, 5) < 0.7
    mask[..., 0] = True
    ref = multi_head_attention_reference(X, **mha.weights, H=3, mask=mask)
    torch.testing.assert_close(mha(X, mask=mask), ref, **TOL[dtype])


@pytest.mark.parametrize("N", [1, 6])
def test_causal_layer_equals_torch_with_a_causal_mask_and_a_key_mask(N):
    torch.manual_seed(4)
    causal = SelfAttention(8, 2, causal=True).double()
    theirs = causal.to_torch()
    X = torch.randn(2, N, 8, dtype=torch.float64)
    keys = torch.rand(2, N) < 0.7
    keys[:, 0] = True  # every query keeps key 0
    upper = ~causal_mask(N)
    with torch.no_grad():
        expected = theirs(X, X, X, attn_mask=upper, need_weights=False)[0]
        torch.testing.assert_close(causal(X), expected, atol=1e-12, rtol=0)
        key_mask = keys[:, None, :].expand(-1, N, -1)
        blocked = (upper | ~key_mask).repeat_interleave(2, dim=0)  # (B*H, N, N), True = blocked
        expected = theirs(X, X, X, attn_mask=blocked, need_weights=False)[0]
        torch.testing.assert_close(causal(X, key_mask), expected, atol=1e-12, rtol=0)


def test_multi_head_attention_with_fewer_queries_than_keys_sees_the_past_only():
    """N queries at the last N of M positions (a cache): each sees keys m <= its own position."""
    g = torch.Generator().manual_seed(5)
    Q, K, V = (torch.randn(2, 3, n, 4, generator=g, dtype=torch.float64) for n in (2, 5, 5))
    Y = multi_head_attention(Q, K, V, causal=True)
    for n, last in enumerate((3, 4)):  # query n is position 3 + n and sees keys 0..3+n
        A = torch.softmax(Q[..., n : n + 1, :] @ K[..., : last + 1, :].mT / 2.0, dim=-1)
        torch.testing.assert_close(Y[..., n : n + 1, :], A @ V[..., : last + 1, :])


def test_batched_mask_equals_torch_per_head_mask():
    ours, theirs = _pair(8, 2, torch.float64)
    X = torch.randn(3, 4, 8, dtype=torch.float64)
    mask = torch.rand(3, 4, 4) < 0.6
    mask[..., 1] = True
    torch_mask = (~mask).repeat_interleave(2, dim=0)  # torch wants (B*H, N, M), True = blocked
    expected = theirs(X, X, X, attn_mask=torch_mask, need_weights=False)[0]
    torch.testing.assert_close(ours(X, mask=mask), expected, atol=1e-10, rtol=0)


def test_round_trip_to_torch():
    torch.manual_seed(2)
    ours = SelfAttention(8, 4)
    back = SelfAttention(8, 4).load_from_torch(ours.to_torch())
    X = torch.randn(2, 3, 8)
    torch.testing.assert_close(back(X), ours(X))


def test_split_and_merge_heads_are_inverse():
    T = torch.randn(2, 5, 12)
    S = split_heads(T, 3)
    assert S.shape == (2, 3, 5, 4)
    assert torch.equal(S[:, 1], T[..., 4:8])  # head 1 owns features 4..7
    assert torch.equal(merge_heads(S), T)


def test_split_and_merge_without_the_transpose_differ_except_with_one_head_or_one_token():
    """The classic slip, a reshape straight to (B, H, N, d) or back, keeps the shape: only H > 1 and
    N > 1 make it visible (the book's checks use H = 2, N = 5)."""
    for N, H in ((5, 2), (5, 1), (1, 3)):
        T = torch.randn(2, N, 6, dtype=torch.float64)
        slip = T.reshape(2, H, N, 6 // H)  # no transpose
        heads = split_heads(T, H)
        assert torch.equal(slip, heads) == (H == 1 or N == 1)
        assert torch.equal(heads.reshape(2, N, 6), T) == (H == 1 or N == 1)  # the merge slip
        assert torch.equal(merge_heads(heads), T)


def test_colour_shape_task_by_hand():
    """eq-mh-toy on three tokens: red circle, red square, blue circle."""
    X = tc.multihead.colour_shape_tokens(["red circle", "red square", "blue circle"])
    assert torch.equal(X, tc.multihead.colour_shape_sequence((1, 1, 1, 0)))
    assert torch.equal(X[1], torch.tensor([1.0, 0.0, 0.0, 1.0], dtype=torch.float64))
    Y = tc.multihead.colour_shape_target(X)
    # the red circle: shapes among the red tokens (one circle, one square), colours among the circles
    assert torch.equal(Y[0], torch.tensor([0.5, 0.5, 0.5, 0.5], dtype=torch.float64))
    # the red square: shapes among the red tokens; the only square is red
    assert torch.equal(Y[1], torch.tensor([0.5, 0.5, 1.0, 0.0], dtype=torch.float64))
    # the blue circle: the only blue token is a circle; colours among the circles
    assert torch.equal(Y[2], torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64))
    with pytest.raises(ValueError, match="'green circle' is not '<colour> <shape>'"):
        tc.multihead.colour_shape_tokens(["green circle"])


def test_two_hand_built_heads_solve_the_colour_shape_task_and_one_head_does_not():
    scale = 8.0
    I2, O2 = torch.eye(2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    colour, shape = torch.cat([I2, O2]), torch.cat([O2, I2])
    W_qk = scale * torch.cat([colour, shape], dim=1)
    W_v, W_o = torch.cat([shape, colour], dim=1), torch.eye(4, dtype=torch.float64)
    X = tc.multihead.colour_shape_sequence((2, 1, 2, 1))
    target = tc.multihead.colour_shape_target(X)
    two = multi_head_attention_reference(X, W_qk, W_qk, W_v, W_o, H=2)
    one = multi_head_attention_reference(X, W_qk, W_qk, W_v, W_o, H=1)
    torch.testing.assert_close(two, target, atol=1e-12, rtol=0)
    assert (one - target).abs().max() > 0.1


@pytest.mark.parametrize("counts", [(2, 1, 1, 2), (1, 2, 2, 1), (3, 1, 2, 1), (1, 1, 1, 1)])
def test_one_head_fitted_to_one_sequence_solves_that_sequence_only(counts):
    """The chapter's "on a single sequence, yes": scores that single out a token's own kind and a
    block-diagonal value map read off the counts reproduce the target on that sequence, not on others."""
    rc, rs, bc, bs = counts
    shapes = [[rc / (rc + rs), rs / (rc + rs)], [bc / (bc + bs), bs / (bc + bs)]]
    colours = [[rc / (rc + bc), bc / (rc + bc)], [rs / (rs + bs), bs / (rs + bs)]]
    W_v = torch.block_diag(*(torch.tensor(T, dtype=torch.float64) for T in (shapes, colours)))
    W_qk, eye = 8.0 * torch.eye(4, dtype=torch.float64), torch.eye(4, dtype=torch.float64)
    X = tc.multihead.colour_shape_sequence(counts)
    Y = multi_head_attention_reference(X, W_qk, W_qk, W_v, eye, H=1)
    torch.testing.assert_close(Y, tc.multihead.colour_shape_target(X), atol=1e-12, rtol=0)
    other = tc.multihead.colour_shape_sequence((2, 2, 1, 1))
    Y_other = multi_head_attention_reference(other, W_qk, W_qk, W_v, eye, H=1)
    assert (Y_other - tc.multihead.colour_shape_target(other)).abs().max() > 0.05


def test_a_query_with_no_visible_key_gives_nan_from_scratch_and_zeros_from_the_package():
    """The chapter's caveat to "the same function": the scratch layer's softmax over no key is NaN."""
    from transformer_course.scratch import attention as scratch

    torch.manual_seed(7)
    ours = SelfAttention(8, 2, bias=False).double()
    mine = scratch.MultiHeadAttention(8, 2, bias=False).double()
    W = ours.weights
    with torch.no_grad():
        for name in ("W_q", "W_k", "W_v", "W_o"):
            getattr(mine, name).weight.copy_(W[name].T)
    X = torch.randn(1, 3, 8, dtype=torch.float64)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 2] = False  # query 2 may see no key
    with torch.no_grad():
        Y_scratch, Y = mine(X, mask), ours(X, mask)
    torch.testing.assert_close(Y_scratch[0, :2], Y[0, :2], atol=1e-12, rtol=0)
    assert torch.isnan(Y_scratch[0, 2]).all() and (Y[0, 2] == 0).all()


def test_bad_input_is_explained():
    with pytest.raises(
        ValueError, match=r"D=10 is not divisible by H=4 .* choose H from \[1, 2, 5, 10\]"
    ):
        SelfAttention(10, 4)
    mha = SelfAttention(8, 2)
    with pytest.raises(ValueError, match=r"expects \(B, N, 8\); add a batch dimension"):
        mha(torch.randn(5, 8))
    with pytest.raises(
        ValueError, match=r"mask has shape \(4, 5\) but must be \(N, M\) = \(5, 5\)"
    ):
        mha(torch.randn(1, 5, 8), mask=torch.ones(4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        mha(torch.randn(2, 4, 8), torch.randn(2, 3, 8))  # self-attention takes no second sequence
    with pytest.raises(ValueError, match="W_o has shape"):
        w = torch.randn(8, 8)
        multi_head_attention_reference(torch.randn(3, 8), w, w, w, torch.randn(8, 4), H=2)


def test_reference_takes_values_of_another_width_than_queries_and_keys():
    """W_q, W_k (D, H d_k), W_v (D, H d_v), W_o (H d_v, D): each head by hand, then concatenated."""
    g = torch.Generator().manual_seed(6)
    N, D, H, d_k, d_v = 5, 6, 3, 2, 6  # d_v = D: Turner's free U_o,h (his V_h) as a concat layer
    X = torch.randn(N, D, generator=g, dtype=torch.float64)
    W_q, W_k = (torch.randn(D, H * d_k, generator=g, dtype=torch.float64) for _ in range(2))
    W_v = torch.randn(D, H * d_v, generator=g, dtype=torch.float64)
    W_o = torch.randn(H * d_v, D, generator=g, dtype=torch.float64)
    heads = []
    for h in range(H):
        Q_h, K_h = X @ W_q[:, h * d_k : (h + 1) * d_k], X @ W_k[:, h * d_k : (h + 1) * d_k]
        A_h = torch.softmax(Q_h @ K_h.T / d_k**0.5, dim=-1)
        heads.append(A_h @ X @ W_v[:, h * d_v : (h + 1) * d_v])
    expected = torch.cat(heads, dim=-1) @ W_o
    Y = multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
    torch.testing.assert_close(Y, expected, atol=1e-12, rtol=0)
    # with W_o = stacked identities, each head's D x D value map is Turner's U_o,h^T
    V = torch.stack([W_v[:, h * D : (h + 1) * D].T for h in range(H)])  # (H, D, D)
    U_q, U_k = W_q.T.reshape(H, d_k, D), W_k.T.reshape(H, d_k, D)
    eye = torch.eye(D, dtype=torch.float64).repeat(H, 1)  # (H D, D)
    Y_turner = tc.notation.turner_multi_head_self_attention(X.T, U_q, U_k, V)
    Y_concat = multi_head_attention_reference(X, W_q, W_k, W_v, eye, H)
    torch.testing.assert_close(Y_concat, Y_turner.T, atol=1e-12, rtol=0)
    with pytest.raises(
        ValueError, match=r"W_o has shape \(6, 6\) but must be \(H\*d_v, D\) = \(18, 6\)"
    ):
        multi_head_attention_reference(X, W_q, W_k, W_v, torch.randn(6, 6), H)
    with pytest.raises(ValueError, match=r"W_q has shape \(6, 5\) but must be \(D, H\*d\)"):
        w = torch.randn(6, 5)
        multi_head_attention_reference(X, w, w, W_v, W_o, H)


def test_fully_masked_query_gives_zero_attention_output():
    torch.manual_seed(3)
    mha = SelfAttention(8, 2, bias=False)
    mask = torch.ones(1, 3, 3, dtype=torch.bool)
    mask[0, 2] = False
    Y = mha(torch.randn(1, 3, 8), mask=mask)
    assert torch.isfinite(Y).all()
    assert (Y[0, 2] == 0).all()  # no bias: a zero attention output stays zero after W_o


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "multihead.attention",
    "multihead.layer",
    "multihead.merge_heads",
    "multihead.param_count",
    "multihead.split_heads",
    "multihead.turner_U_o",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("multihead.") == NAMES


def test_split_and_merge_equal_the_package_and_invert_each_other():
    T = torch.randn(2, 5, 12, dtype=torch.float64)
    for H in (1, 2, 3, 4, 6, 12):
        split = mh.split_heads(T, H)
        assert split.shape == (2, H, 5, 12 // H)
        assert torch.equal(split, tc.multihead.split_heads(T, H))
        assert torch.equal(mh.merge_heads(split), T)
        assert torch.equal(mh.merge_heads(split), tc.multihead.merge_heads(split))
        d = 12 // H
        for h in range(H):  # head h owns the contiguous block h*d:(h+1)*d
            assert torch.equal(split[:, h], T[..., h * d : (h + 1) * d])


def test_forgotten_transpose_in_split_keeping_n_h_order_is_a_shape_error():
    def no_transpose(T, H):
        B, N, HD = T.shape
        return T.reshape(B, N, H, HD // H)  # (B, N, H, d): the transpose to (B, H, N, d) is missing

    feedback = tc.exercises.check("multihead.split_heads", no_transpose)
    assert feedback.status == "incorrect" and "wrong shape" in feedback.message


def test_attention_solution_equals_package_reference_and_module():
    for trial in range(3):
        X, W_q, W_k, W_v, W_o, H = mh._mha_inputs(torch.Generator().manual_seed(5), trial)
        Y = mh.multi_head_attention(X, W_q, W_k, W_v, W_o, H)
        ref = tc.multihead.multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
        torch.testing.assert_close(Y, ref, atol=1e-12, rtol=0)
        module = tc.multihead.SelfAttention(X.shape[1], H, bias=False).double()
        with torch.no_grad():
            module.in_proj.weight.copy_(torch.cat([W_q.T, W_k.T, W_v.T]))  # nn.Linear: (out, in)
            module.out_proj.weight.copy_(W_o.T)
        torch.testing.assert_close(module(X[None])[0], Y, atol=1e-12, rtol=0)


def test_attention_inputs_do_not_saturate_the_softmax():
    # With order-one scores the scale mistake is visible; saturated softmaxes would hide it.
    X, W_q, W_k, W_v, W_o, H = mh._mha_inputs(torch.Generator().manual_seed(1000), 0)
    Y = mh.multi_head_attention(X, W_q, W_k, W_v, W_o, H)
    assert (Y - mh._mha_scale_sqrt_D(X, W_q, W_k, W_v, W_o, H)).abs().max() > 1e-3


def test_turner_U_o_equals_package_is_low_rank_and_gives_the_same_layer():
    W_v, W_o, H = mh._U_o_inputs(torch.Generator().manual_seed(2), 2)
    D, d = W_v.shape[0], W_v.shape[0] // H  # d = d_k = d_v
    U_o = mh.turner_U_o(W_v, W_o, H)
    torch.testing.assert_close(U_o, tc.notation.low_rank_V(W_v, W_o, H), atol=1e-12, rtol=0)
    assert all(int(torch.linalg.matrix_rank(U_o[h])) == d for h in range(H))
    torch.testing.assert_close(U_o.sum(0), (W_v @ W_o).T, atol=1e-12, rtol=0)
    # Turner's sum over heads with these U_o,h is the concat form, transposed (the notes' exercise 5)
    W_q, W_k = torch.randn(D, D, dtype=torch.float64), torch.randn(D, D, dtype=torch.float64)
    X = torch.randn(5, D, dtype=torch.float64)
    U_q = W_q.T.reshape(H, d, D)  # head h's d_k x D query map: rows h*d:(h+1)*d of W_q^T
    U_k = W_k.T.reshape(H, d, D)
    Y_cols = tc.notation.turner_multi_head_self_attention(X.T, U_q, U_k, U_o)
    Y = tc.multihead.multi_head_attention_reference(X, W_q, W_k, W_v, W_o, H)
    torch.testing.assert_close(Y_cols.T, Y, atol=1e-10, rtol=0)


@pytest.mark.parametrize(("D", "H"), [(8, 1), (8, 2), (12, 3), (64, 8)])
@pytest.mark.parametrize("bias", [True, False])
def test_param_count_matches_the_modules(D, H, bias):
    P_concat, P_turner = (int(p) for p in mh.param_count(D, H, bias))
    ours = tc.multihead.SelfAttention(D, H, bias=bias)
    theirs = torch.nn.MultiheadAttention(D, H, bias=bias)
    assert P_concat == sum(p.numel() for p in ours.parameters())
    assert P_concat == sum(p.numel() for p in theirs.parameters())
    d_k = D // H
    turner = [torch.empty(H, d_k, D), torch.empty(H, d_k, D), torch.empty(H, D, D)]  # U_q, U_k, U_o
    assert P_turner == sum(t.numel() for t in turner)


def test_param_count_accepts_a_tuple_of_ints():
    def as_ints(D, H, bias):
        return 4 * D * D + 4 * D * bias, H * (2 * (D // H) * D + D * D)

    assert tc.exercises.check("multihead.param_count", as_ints)


# ----------------------------------------------------------------------------------------------
# The layer exercise (Lab 4, section 3): the learner's nn.Module, checked with the package's weights


def _layer_case(trial):
    ex = tc.exercises._get("multihead.layer")
    return ex, *ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)


def test_layer_solution_equals_the_package_layer_with_its_weights_by_name():
    for trial in range(3):
        _, X, layer = _layer_case(trial)
        state = mh.lab_state_dict(layer)
        assert sorted(state) == sorted(mh.LAB_NAMES)
        W = layer.weights  # the course's X @ W convention: nn.Linear's weight is W^T
        for name in ("W_q", "W_k", "W_v", "W_o"):
            assert torch.equal(state[f"{name}.weight"], W[name].T)
        with torch.no_grad():
            expected = layer(X)
            Y = mh._run(mh.MultiHeadSelfAttention, X, layer)
            ref = multi_head_attention_reference(X, **W, H=layer.H)  # biases are not in W
        torch.testing.assert_close(Y, expected, atol=1e-12, rtol=0)
        assert (Y - ref).abs().max() > 1e-3  # so the biases count: a layer without them fails


def test_layer_mistakes_differ_from_the_package_and_from_each_other_on_every_trial():
    """Every wrong layer is caught on every trial, and no two give the same output, so the checker's
    first matching mistake is the one the learner made."""
    for trial in range(3):
        ex, X, layer = _layer_case(trial)
        with torch.no_grad():
            expected = layer(X)
        outputs = {m.wrong.__name__: mh._run(m.wrong, X, layer) for m in ex.mistakes}
        assert len(outputs) == len(ex.mistakes) >= 5
        for name, Y in outputs.items():
            assert Y.shape == expected.shape, name
            assert (Y - expected).abs().max() > 1e-2, (trial, name)
        names = list(outputs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert (outputs[a] - outputs[b]).abs().max() > 1e-2, (trial, a, b)


def test_layer_checker_names_each_mistake_and_accepts_other_correct_layers():
    name = "multihead.layer"
    for mistake in tc.exercises._get(name).mistakes:
        feedback = tc.exercises.check(name, mistake.wrong)
        assert feedback.status == "incorrect" and mistake.why in feedback.message

    class HeadByHead(nn.Module):  # a loop over heads with PyTorch's kernel: also right
        def __init__(self, D, H):
            super().__init__()
            self.H = H
            self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

        def forward(self, X):
            d_k = X.shape[-1] // self.H
            Q, K, V = self.W_q(X), self.W_k(X), self.W_v(X)
            heads = []
            for h in range(self.H):
                s = slice(h * d_k, (h + 1) * d_k)
                heads.append(
                    nn.functional.scaled_dot_product_attention(Q[..., s], K[..., s], V[..., s])
                )
            return self.W_o(torch.cat(heads, dim=-1))

    assert tc.exercises.check(name, HeadByHead).status == "correct"


def test_layer_checker_explains_what_it_cannot_run():
    name = "multihead.layer"

    class Skeleton(nn.Module):
        def __init__(self, D, H):
            super().__init__()
            raise NotImplementedError

    class ExplicitParameters(nn.Module):
        def __init__(self, D, H):
            super().__init__()
            self.W_q = nn.Parameter(torch.randn(D, D))

        def forward(self, X):
            return X @ self.W_q

    class Crashes(nn.Module):
        def __init__(self, D, H):
            super().__init__()
            self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(D, D) for _ in range(4))

        def forward(self, X):
            return self.W_q(X) @ self.W_k(X)  # (B, N, D) @ (B, N, D): not conformable

    assert tc.exercises.check(name, Skeleton).status == "not attempted"
    assert tc.exercises.check(name, None).status == "not attempted"
    fb = tc.exercises.check(name, ExplicitParameters)
    assert fb.status == "incorrect" and "no parameter `W_q.weight`" in fb.message
    assert "nn.Linear(D, D)" in fb.message
    fb = tc.exercises.check(name, Crashes)
    assert fb.status == "error" and "RuntimeError" in fb.message and "line" in fb.message
    fb = tc.exercises.check(name, mh.MultiHeadSelfAttention(6, 2))
    assert fb.status == "incorrect" and "pass the class itself" in fb.message


def test_layer_checker_leaves_the_random_state_alone():
    torch.manual_seed(0)
    tc.exercises.check("multihead.layer", mh.MultiHeadSelfAttention)
    after = torch.randn(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(3))  # a lab's later cells draw the same numbers


def test_layer_solution_is_printed_as_a_class(capsys):
    src = tc.exercises.solution("multihead.layer")
    assert src.startswith("class MultiHeadSelfAttention(nn.Module):")
    assert len(src.strip().splitlines()) <= 22  # "about 20 lines"
