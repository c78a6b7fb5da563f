"""Tests of the extensions' attention parts beyond tests/test_extensions.py: the backward pass of tiled
attention and its memory traffic (extensions/flash.py), the rolling-buffer cache of sliding-window
attention and interleaved local/global layers (extensions/sliding_window.py)."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.extensions import flash as fl
from transformer_course.extensions import sliding_window as sw
from transformer_course.language_models import KVCache
from transformer_course.self_attention import causal_mask, scaled_dot_product_attention_reference

f64 = torch.float64


def _qkv(N, M, d_k=5, d_v=3, batch=(2,), dtype=f64, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    Q = torch.randn(*batch, N, d_k, generator=g, dtype=dtype)
    K = torch.randn(*batch, M, d_k, generator=g, dtype=dtype)
    V = torch.randn(*batch, M, d_v, generator=g, dtype=dtype)
    return tuple(t.requires_grad_(grad) for t in (Q, K, V))


# ----------------------------------------------------------------------------------------------
# The backward pass of tiled attention


@pytest.mark.parametrize(
    "N, M, causal, bq, bk",
    [(13, 13, False, 4, 5), (13, 13, True, 4, 5), (7, 19, True, 3, 4), (9, 11, False, 16, 16),
     (1, 6, False, 1, 1), (12, 12, True, 12, 1)],
)  # fmt: skip
def test_tiled_backward_equals_autograd_through_the_softmax_formula(N, M, causal, bq, bk):
    Q, K, V = _qkv(N, M)
    dO = torch.randn(2, N, 3, generator=torch.Generator().manual_seed(1), dtype=f64)
    mask = causal_mask(N, M) if causal else None
    ref = scaled_dot_product_attention_reference(Q, K, V, mask)
    expected = torch.autograd.grad(ref, (Q, K, V), dO)
    out = fl.tiled_attention_with_grad(Q, K, V, bq, bk, causal)
    got = torch.autograd.grad(out, (Q, K, V), dO)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=0)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-10, rtol=0)
    # float32 within 1e-5
    Q32, K32, V32 = (t.detach().float().requires_grad_() for t in (Q, K, V))
    got32 = torch.autograd.grad(
        fl.tiled_attention_with_grad(Q32, K32, V32, bq, bk, causal), (Q32, K32, V32), dO.float()
    )
    for g, e in zip(got32, expected, strict=True):
        torch.testing.assert_close(g.double(), e, atol=1e-5, rtol=1e-5)


def test_tiled_backward_passes_gradcheck_with_a_custom_scale():
    Q, K, V = _qkv(6, 8, d_k=4, d_v=2, batch=(2, 1))
    assert torch.autograd.gradcheck(
        lambda q, k, v: fl.tiled_attention_with_grad(q, k, v, 4, 3, True, scale=0.7), (Q, K, V)
    )
    assert torch.autograd.gradcheck(
        lambda q, k, v: fl.tiled_attention_with_grad(q, k, v, 2, 5), (Q, K, V)
    )


def test_the_backward_detects_wrong_variants():
    """The gradient check must reject a backward that forgets the D term or uses the scores."""
    Q, K, V = (t.detach() for t in _qkv(9, 9))
    dO = torch.randn(2, 9, 3, dtype=f64)
    O, L = fl.tiled_attention_forward(Q, K, V, 4, 4, False, None)
    Qr, Kr, Vr = (t.clone().requires_grad_() for t in (Q, K, V))
    expected = torch.autograd.grad(scaled_dot_product_attention_reference(Qr, Kr, Vr), (Qr,), dO)[0]
    dQ, _, _ = fl.tiled_attention_backward(Q, K, V, O, L, dO, 4, 4)
    torch.testing.assert_close(dQ, expected, atol=1e-10, rtol=0)
    wrong = fl.tiled_attention_backward(Q, K, V, O, torch.zeros_like(L), dO, 4, 4)[0]  # P = e^S
    assert (wrong - expected).abs().max() > 1e-3
    no_d = fl.tiled_attention_backward(Q, K, V, torch.zeros_like(O), L, dO, 4, 4)[0]  # D = 0
    assert (no_d - expected).abs().max() > 1e-3


def test_the_forward_log_sum_exp_is_the_rows_logsumexp():
    Q, K, V = (t.detach() for t in _qkv(11, 14))
    _, L = fl.tiled_attention_forward(Q, K, V, 4, 3, True, None)
    S = (Q @ K.mT / Q.shape[-1] ** 0.5).masked_fill(~causal_mask(11, 14), float("-inf"))
    torch.testing.assert_close(L, torch.logsumexp(S, -1), atol=1e-12, rtol=0)


def test_autograd_keeps_no_score_matrix():
    """What the tiled function saves for the backward: Q, K, V, O and L; never an N x M tensor."""
    N = 96
    Q, K, V = _qkv(N, N, d_k=8, d_v=8, batch=())
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.shape) or t, lambda t: t
    ):
        fl.tiled_attention_with_grad(Q, K, V, 16, 16).sum()
        tiled = list(saved)
        saved.clear()
        scaled_dot_product_attention_reference(Q, K, V).sum()
    assert sorted(tiled) == sorted([(N, 8)] * 4 + [(N,)])
    assert (N, N) in saved


def test_backward_errors_are_clear():
    Q, K, V = (t.detach() for t in _qkv(5, 5))
    O, L = fl.tiled_attention_forward(Q, K, V, 2, 2, False, None)
    with pytest.raises(ValueError, match="pass the Y and rho"):
        fl.tiled_attention_backward(Q, K, V, O, L[..., :-1], O)
    with pytest.raises(ValueError, match="block sizes"):
        fl.tiled_attention_backward(Q, K, V, O, L, O, 0, 2)
    with pytest.raises(ValueError, match="block sizes"):
        fl.tiled_attention_with_grad(Q, K, V, 2, 2.5)
    with pytest.raises(ValueError, match="M >= N"):
        fl.tiled_attention_with_grad(Q, K[..., :3, :], V[..., :3, :], causal=True)


# ----------------------------------------------------------------------------------------------
# Memory traffic (IO) counts


@pytest.mark.parametrize(
    "N, M, d, bq, bk", [(16, 16, 4, 4, 4), (37, 50, 8, 16, 7), (5, 9, 3, 8, 8), (64, 64, 2, 1, 64)]
)
def test_io_formulas_equal_the_instrumented_loops(N, M, d, bq, bk):
    Q, K, V = (t.detach() for t in _qkv(N, M, d, d, batch=()))
    io = fl.IOCounter()
    out = fl.tiled_attention(Q, K, V, bq, bk, io=io)
    assert (io.reads, io.writes) == fl.tiled_attention_io(N, M, d, bq, bk)
    io_bwd = fl.IOCounter()
    _, L = fl.tiled_attention_forward(Q, K, V, bq, bk, False, None)
    fl.tiled_attention_backward(Q, K, V, out, L, torch.ones_like(out), bq, bk, io=io_bwd)
    assert (io_bwd.reads, io_bwd.writes) == fl.tiled_attention_io(N, M, d, bq, bk, backward=True)
    io_mat = fl.IOCounter()
    torch.testing.assert_close(fl.materialised_attention(Q, K, V, io_mat), out, atol=1e-12, rtol=0)
    assert (io_mat.reads, io_mat.writes) == fl.materialised_attention_io(N, M, d)
    if -(-N // bq) > 1:  # K, V read once: the wrong count, rejected when there are several tiles
        assert io.reads != N * d + 2 * M * d


def test_io_grows_as_the_ioc_argument_says():
    """Materialised reads grow with N^2; tiled reads with N^2 d / N_t: with Dao et al.'s tiles of
    about SRAM / (4 d) rows, doubling the fast memory halves the re-reads of K and V."""
    N, d = 4096, 64
    naive = fl.materialised_attention_io(N, N, d)[0]
    reads = [fl.tiled_attention_io(N, N, d, sram // (4 * d), 64)[0] for sram in (2**15, 2**16)]
    assert naive == 3 * N * d + 2 * N * N
    assert reads[0] - N * d == 2 * (reads[1] - N * d)
    assert reads[1] < naive


def test_io_errors():
    with pytest.raises(ValueError, match="N must be a positive int"):
        fl.tiled_attention_io(0, 4, 4, 2, 2)
    with pytest.raises(ValueError, match="block sizes"):
        fl.tiled_attention_io(4, 4, 4, 0, 2)
    with pytest.raises(ValueError, match="d must be"):
        fl.materialised_attention_io(4, 4, -1)


# ----------------------------------------------------------------------------------------------
# The rolling-buffer cache


@pytest.mark.parametrize("N, w", [(17, 5), (6, 8), (9, 1), (12, 12)])
def test_rolling_cache_decoding_equals_the_windowed_layer(N, w):
    torch.manual_seed(0)
    layer = tc.multihead.SelfAttention(8, 2).double().eval()
    X = torch.randn(2, N, 8, dtype=f64)
    cache = sw.RollingKVCache(w)
    with torch.no_grad():
        steps = torch.cat([layer(X[:, n : n + 1], None, cache) for n in range(N)], dim=1)
        expected = layer(X, sw.sliding_window_mask(N, w))
        full = layer(X, causal_mask(N))
    torch.testing.assert_close(steps, expected, atol=1e-10, rtol=0)
    if N > w:
        assert (steps - full).abs().max() > 1e-3  # the window really cuts
    assert cache.K.shape[-2] == w and len(cache) == min(N, w) and cache.position == N
    # time order: the last min(N, w) keys
    _, K_all, _ = layer.project(X)
    K_ord, _ = cache.ordered()
    torch.testing.assert_close(K_ord, K_all[:, :, max(0, N - w) :], atol=1e-12, rtol=0)


def test_rolling_cache_writes_slot_n_mod_w_and_stays_bounded():
    w, cache = 3, sw.RollingKVCache(3)
    sizes = []
    for n in range(10):
        K = torch.full((1, 1, 1, 2), float(n))
        Kc, _ = cache.update(K, K)
        sizes.append(Kc.shape[-2])
        assert cache.K[0, 0, n % w, 0] == n
    assert sizes == [1, 2, 3] + [3] * 7
    assert sorted(cache.K[0, 0, :, 0].tolist()) == [7.0, 8.0, 9.0]
    cache.reset()
    assert len(cache) == 0


def test_rolling_cache_errors():
    with pytest.raises(ValueError, match="positive int"):
        sw.RollingKVCache(0)
    with pytest.raises(ValueError, match="positive int"):
        sw.RollingKVCache(True)
    cache = sw.RollingKVCache(4)
    with pytest.raises(ValueError, match="call update"):
        cache.ordered()
    with pytest.raises(ValueError, match="one token per step"):
        cache.update(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, 4))


# ----------------------------------------------------------------------------------------------
# Interleaved local and global layers


def test_local_global_pattern_and_masks():
    assert sw.local_global_windows(6, 4, 2) == [4, None, 4, None, 4, None]
    assert sw.local_global_windows(3, 4, 5) == [4, 4, 4]
    masks = sw.interleaved_masks(7, [2, None])
    assert torch.equal(masks[0], sw.sliding_window_mask(7, 2))
    assert torch.equal(masks[1], causal_mask(7))
    with pytest.raises(ValueError, match="global_every"):
        sw.local_global_windows(4, 4, 0)
    with pytest.raises(ValueError, match="layer 1"):
        sw.interleaved_masks(4, [2, 0])
    with pytest.raises(ValueError, match="none"):
        sw.receptive_field(4, [])


def _reach_by_products(N, windows):
    R = torch.eye(N, dtype=torch.long)
    for m in sw.interleaved_masks(N, windows):
        R = ((m.long() @ R) > 0).long()  # layer l after the ones before it
    return R.bool()


@pytest.mark.parametrize("windows", [[4, 4, 4], [3, 5], [2, None, 2], [None], [1, 1], [6, 3, 2, 4]])
def test_receptive_field_equals_reachability_through_the_masks(windows):
    N = 30
    assert torch.equal(sw.receptive_field(N, windows), _reach_by_products(N, windows))
    if all(w is not None and w > 1 for w in windows):  # a wrong span, L w, is rejected
        span = sum(windows)
        off = torch.arange(N)[:, None] - torch.arange(N)[None, :]
        assert not torch.equal((off >= 0) & (off <= span), _reach_by_products(N, windows))


def test_receptive_field_by_autograd_in_an_interleaved_stack():
    torch.manual_seed(0)
    N, windows = 16, [3, 3, None]
    stack = tc.block.TransformerStack(tc.block.PreNormBlock, 3, 8, 2).double()
    for last in (2, 3):  # two local layers, then with the global one
        X = torch.randn(1, N, 8, dtype=f64, requires_grad=True)
        sub = torch.nn.ModuleList(stack.blocks[:last])
        Z = X
        for blk, m in zip(sub, sw.interleaved_masks(N, windows[:last]), strict=True):
            Z = blk(Z, m)
        Z[0, -1].sum().backward()
        depends = X.grad[0].abs().sum(-1) > 0
        assert torch.equal(depends, sw.receptive_field(N, windows[:last])[-1])


@pytest.mark.parametrize("windows", [[4, None, 4], [3, 3], [None, 2]])
def test_decoding_an_interleaved_stack_with_rolling_caches(windows):
    torch.manual_seed(0)
    N, D = 19, 8
    stack = tc.block.TransformerStack(tc.block.PreNormBlock, len(windows), D, 2).double().eval()
    X = torch.randn(2, N, D, dtype=f64)
    with torch.no_grad():
        expected = sw.forward_with_masks(stack, X, sw.interleaved_masks(N, windows))
        got, caches = sw.decode_windowed(stack, X, windows)
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=0)
    assert sum(len(c) for c in caches) == sw.kv_cache_entries(N, windows)
    for c, w in zip(caches, windows, strict=True):
        assert isinstance(c, KVCache if w is None else sw.RollingKVCache)
        assert len(c) == (N if w is None else min(N, w))
    assert sw.kv_cache_entries(N, windows) < len(windows) * N


def test_stack_helpers_errors():
    stack = tc.block.TransformerStack(tc.block.PreNormBlock, 2, 8, 2)
    X = torch.randn(1, 4, 8)
    with pytest.raises(ValueError, match="one per block"):
        sw.forward_with_masks(stack, X, sw.interleaved_masks(4, [2]))
    with pytest.raises(ValueError, match="one per block"):
        sw.decode_windowed(stack, X, [2, 2, 2])
    with pytest.raises(ValueError, match="non-negative"):
        sw.kv_cache_entries(-1, [2])
