"""Chapter *Extensions*: every modern part equals its definition (RMSNorm, gated MLPs, RoPE, ALiBi,
grouped-query attention, online softmax and tiled attention, sliding windows), the comparisons with
newer PyTorch skip cleanly on older versions, the modern GPT trains and decodes with its cache, and
the exercises' specifics hold (the benchmark's quick mode is in test_bench.py)."""

from __future__ import annotations

import math
import pathlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import transformer_course as tc
from transformer_course import extensions as ext
from transformer_course.exercises import extensions as ee
from transformer_course.language_models import GPT, SHAKESPEARE_CPU, LMRecipe, generate
from transformer_course.multihead import SelfAttention
from transformer_course.position import relative_shift_matrix
from transformer_course.self_attention import causal_mask, scaled_dot_product_attention_reference
from transformer_course.train import TrainConfig

ROOT = pathlib.Path(__file__).resolve().parents[1]
f64 = torch.float64


def _has_data() -> bool:
    try:
        tc.data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        return False
    return True


needs_data = pytest.mark.skipif(not _has_data(), reason="no local tiny-shakespeare")

# ----------------------------------------------------------------------------------------------
# Newer PyTorch: detected, and skipped with a note on older versions


def test_torch_lacks_says_why_a_comparison_is_skipped(monkeypatch):
    monkeypatch.setattr(torch, "__version__", "2.13.0+cpu")
    monkeypatch.setattr(
        torch.nn, "RMSNorm", torch.nn.LayerNorm, raising=False
    )  # present, as in 2.4+
    assert ext.torch_lacks("nn.RMSNorm") is None
    assert ext.torch_lacks("enable_gqa") is None
    monkeypatch.delattr(torch.nn, "RMSNorm")
    note = ext.torch_lacks("nn.RMSNorm")
    assert "no nn.RMSNorm (added in 2.4)" in note and "skipped" in note
    monkeypatch.setattr(torch, "__version__", "2.4.1+cpu")
    assert "no enable_gqa (added in 2.5)" in ext.torch_lacks("enable_gqa")
    monkeypatch.setattr(torch, "__version__", "2.10.0a0")
    assert ext.torch_lacks("enable_gqa") is None  # 2.10 > 2.5: minor versions compare as numbers
    with pytest.raises(ValueError, match="unknown feature"):
        ext.torch_lacks("flash")


def test_package_parts_work_without_the_newer_torch_features(monkeypatch):
    monkeypatch.delattr(torch.nn, "RMSNorm", raising=False)  # absent before torch 2.4
    X = torch.randn(2, 3, 8, dtype=f64)
    torch.testing.assert_close(
        ext.RMSNorm(8).double()(X), ext.rms_norm_reference(X, torch.ones(8, dtype=f64))
    )
    model = ext.ModernGPT(dataclass_replace(ext.MODERN_CPU, n_layers=1, H_kv=2))
    assert model(torch.zeros(1, 4, dtype=torch.long))[0].shape == (1, 4, 65)


def dataclass_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


# ----------------------------------------------------------------------------------------------
# RMSNorm


def test_rms_norm_equals_its_formula_and_torch():
    torch.manual_seed(0)
    X = 3 * torch.randn(4, 5, 8, dtype=f64) + 1
    norm = ext.RMSNorm(8, eps=1e-3).double()
    with torch.no_grad():
        norm.weight.normal_()
    x = X[1, 2]  # one token, by hand
    expected = norm.weight * x / torch.sqrt((x * x).sum() / 8 + 1e-3)
    torch.testing.assert_close(norm(X)[1, 2], expected, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        norm(X), ext.rms_norm_reference(X, norm.weight, 1e-3), atol=1e-12, rtol=0
    )
    if (note := ext.torch_lacks("nn.RMSNorm")) is not None:
        pytest.skip(note)
    theirs = nn.RMSNorm(8, eps=1e-3).double()
    theirs.load_state_dict(norm.state_dict())
    torch.testing.assert_close(norm(X), theirs(X), atol=1e-12, rtol=0)


def test_rms_norm_is_layer_norm_of_the_centred_token_and_scale_invariant():
    X = torch.randn(3, 6, 10, dtype=f64) + 2
    g = torch.randn(10, dtype=f64)
    centred = X - X.mean(-1, keepdim=True)
    ln = F.layer_norm(X, (10,), g, None, 1e-5)
    torch.testing.assert_close(ext.rms_norm_reference(centred, g, 1e-5), ln, atol=1e-12, rtol=0)
    assert not torch.allclose(ext.rms_norm_reference(X, g), ln)  # the mean matters here
    torch.testing.assert_close(
        ext.rms_norm_reference(7 * X, g, 0.0), ext.rms_norm_reference(X, g, 0.0)
    )


def test_rms_norm_half_precision_and_errors():
    X = torch.randn(2, 3, 8)
    norm = ext.RMSNorm(8)
    torch.testing.assert_close(norm(X.bfloat16()).float(), norm(X), atol=3e-2, rtol=3e-2)
    with pytest.raises(ValueError, match="tokens of width 6"):
        norm(torch.randn(2, 6))
    with pytest.raises(ValueError, match=r"must be \(D,\)"):
        ext.rms_norm_reference(X, torch.ones(5))


# ----------------------------------------------------------------------------------------------
# Gated MLPs


@pytest.mark.parametrize("activation", sorted(ext.GATES))
def test_gated_mlp_equals_its_formula(activation):
    torch.manual_seed(1)
    mlp = ext.GatedMLP(12, 20, activation).double()
    X = torch.randn(2, 5, 12, dtype=f64)
    W = mlp.weights
    expected = ext.gated_mlp_reference(X, W["W_g"], W["W_1"], W["W_2"], activation)
    torch.testing.assert_close(mlp(X), expected, atol=1e-12, rtol=0)


def test_swiglu_is_swish_gated_and_parameter_matched():
    mlp = ext.SwiGLU(16).double()
    X = torch.randn(3, 16, dtype=f64)
    W = mlp.weights
    a = X @ W["W_g"]
    torch.testing.assert_close(mlp(X), (a * torch.sigmoid(a) * (X @ W["W_1"])) @ W["W_2"])
    assert ext.swiglu_hidden(768) == 2048  # Shazeer (2020): d_ff 3072 -> 2048 at d_model 768
    assert ext.swiglu_hidden(128) == 341 and ext.swiglu_hidden(128, multiple_of=8) == 344
    for D in (64, 128, 384, 768):
        swiglu = sum(p.numel() for p in ext.SwiGLU(D).parameters())
        gelu = sum(p.numel() for p in tc.block.MLP(D, 4 * D, "gelu").parameters())
        assert abs(swiglu - gelu) <= 1.5 * D + 5 * D  # rounding of d_ff, and the MLP's biases
    with pytest.raises(ValueError, match="unknown gate"):
        ext.GatedMLP(4, 4, "tanh")


# ----------------------------------------------------------------------------------------------
# RoPE


@pytest.mark.parametrize("base", [10_000.0, 30.0])
def test_rope_three_forms_agree_and_match_the_position_chapter(base):
    torch.manual_seed(2)
    X = torch.randn(2, 3, 7, 8, dtype=f64)
    positions = torch.tensor([0, 5, 1, 33, 2, 1000, 7])
    fast = ext.apply_rope(X, positions, base)
    torch.testing.assert_close(
        fast, ext.apply_rope_reference(X, positions, base), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(fast, ext.apply_rope_complex(X, positions, base), atol=1e-12, rtol=0)
    for n in (0, 3, 17):  # R_n is the position chapter's Phi_{-n} (its rotation runs the other way)
        torch.testing.assert_close(
            ext.rope_rotation_matrix(n, 8, base), relative_shift_matrix(-n, 8, base)
        )
    torch.testing.assert_close(fast.norm(dim=-1), X.norm(dim=-1))  # rotations keep lengths
    assert not torch.allclose(fast, X)


def test_rope_in_float32_and_default_positions():
    X = torch.randn(2, 4, 16)
    torch.testing.assert_close(
        ext.apply_rope(X), ext.apply_rope_reference(X.double()).float(), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(ext.apply_rope(X)[:, 0], X[:, 0])  # position 0 is not rotated


def test_rope_halves_layout_is_a_permutation_of_the_pairs():
    X = torch.randn(3, 5, 10, dtype=f64)
    pos = torch.arange(3, 8)
    perm = torch.cat([torch.arange(0, 10, 2), torch.arange(1, 10, 2)])  # (x0, x2, ..., x1, x3, ...)
    torch.testing.assert_close(
        ext.apply_rope_halves(X[..., perm], pos), ext.apply_rope(X, pos)[..., perm]
    )
    assert not torch.allclose(ext.apply_rope_halves(X, pos), ext.apply_rope(X, pos))


def test_rope_scores_depend_only_on_the_offset_after_the_projections():
    torch.manual_seed(3)
    D, d = 12, 8
    W_q, W_k = torch.randn(2, D, d, dtype=f64)
    x_a, x_b = torch.randn(2, D, dtype=f64)

    def score(n, m):
        q = ext.apply_rope((x_a @ W_q)[None], torch.tensor([n]))
        k = ext.apply_rope((x_b @ W_k)[None], torch.tensor([m]))
        return (q @ k.T).item()

    for n, m, s in [(0, 3, 5), (7, 2, 100), (40, 41, -30)]:
        assert abs(score(n, m) - score(n + s, m + s)) < 1e-10
    assert abs(score(0, 3) - score(0, 4)) > 1e-6  # but it does depend on the offset


def test_rope_errors():
    with pytest.raises(ValueError, match="d must be even"):
        ext.apply_rope(torch.randn(2, 5))
    with pytest.raises(ValueError, match="one position per token"):
        ext.apply_rope(torch.randn(3, 4), torch.arange(4))
    with pytest.raises(ValueError, match="d must be even"):
        ext.RotaryEmbedding(7)


# ----------------------------------------------------------------------------------------------
# ALiBi


def test_alibi_slopes_follow_press_et_al():
    torch.testing.assert_close(ext.alibi_slopes(8), 2.0 ** -torch.arange(1.0, 9.0, dtype=f64))
    torch.testing.assert_close(ext.alibi_slopes(2), torch.tensor([2.0**-4, 2.0**-8], dtype=f64))
    six = ext.alibi_slopes(6)  # 4 slopes of H = 4, then every other slope of H = 8
    torch.testing.assert_close(
        six, torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3], dtype=f64)
    )
    with pytest.raises(ValueError):
        ext.alibi_slopes(0)


@pytest.mark.parametrize(("N", "M"), [(6, 6), (3, 7), (1, 5)])
def test_alibi_attention_equals_the_loop(N, M):
    torch.manual_seed(4)
    Q = torch.randn(2, 4, N, 5, dtype=f64)
    K, V = torch.randn(2, 2, 4, M, 5, dtype=f64)
    slopes = ext.alibi_slopes(4)
    torch.testing.assert_close(
        ext.alibi_attention(Q, K, V, slopes),
        ext.alibi_attention_reference(Q, K, V, slopes),
        atol=1e-12,
        rtol=0,
    )
    bias = ext.alibi_bias(N, slopes, M)  # depends on n - m only: constant along each diagonal
    for j in range(-N + 1, M):
        diag = bias.diagonal(j, dim1=-2, dim2=-1)
        assert (diag - diag[..., :1]).abs().max() < 1e-12
    with pytest.raises(ValueError, match="one slope per head"):
        ext.alibi_attention(Q, K, V, slopes[:3])


# ----------------------------------------------------------------------------------------------
# Grouped-query attention


@pytest.mark.parametrize(("H", "H_kv"), [(4, 4), (4, 2), (4, 1), (6, 3)])
def test_gqa_layer_equals_its_reference_and_mha_with_repeated_kv(H, H_kv):
    torch.manual_seed(5)
    D, N = 24, 7
    layer = ext.GroupedQueryAttention(D, H, H_kv, causal=True).double()
    X = torch.randn(2, N, D, dtype=f64)
    W = layer.weights
    expected = ext.gqa_reference(X, W["W_q"], W["W_k"], W["W_v"], W["W_o"], H, H_kv, causal_mask(N))
    torch.testing.assert_close(layer(X), expected, atol=1e-12, rtol=0)
    # multi-head attention whose key and value maps repeat each group's columns: the same function
    d_k, n_rep = D // H, H // H_kv
    cols = torch.arange(H).repeat_interleave(d_k) // n_rep * d_k + torch.arange(d_k).repeat(H)
    mha = SelfAttention(D, H, causal=True, bias=False).double()
    with torch.no_grad():
        mha.in_proj.weight.copy_(torch.cat([W["W_q"], W["W_k"][:, cols], W["W_v"][:, cols]], 1).T)
        mha.out_proj.weight.copy_(W["W_o"].T)
    torch.testing.assert_close(layer(X), mha(X), atol=1e-12, rtol=0)


def test_gqa_with_all_heads_is_the_course_self_attention():
    torch.manual_seed(6)
    mha = SelfAttention(16, 4).double()
    layer = ext.GroupedQueryAttention(16, 4, bias=True).double()
    with torch.no_grad():
        Wq, Wkv = mha.in_proj.weight.split([16, 32])
        bq, bkv = mha.in_proj.bias.split([16, 32])
        layer.q_proj.weight.copy_(Wq), layer.q_proj.bias.copy_(bq)
        layer.kv_proj.weight.copy_(Wkv), layer.kv_proj.bias.copy_(bkv)
        layer.out_proj.load_state_dict(mha.out_proj.state_dict())
    X = torch.randn(3, 5, 16, dtype=f64)
    mask = torch.rand(3, 5, 5) > 0.3
    torch.testing.assert_close(layer(X, mask), mha(X, mask), atol=1e-12, rtol=0)


def test_gqa_equals_torch_enable_gqa():
    if (note := ext.torch_lacks("enable_gqa")) is not None:
        pytest.skip(note)
    torch.manual_seed(7)
    layer = ext.GroupedQueryAttention(24, 6, 2, causal=True).double()
    X = torch.randn(2, 9, 24, dtype=f64)
    Q, K, V = layer.project(X)
    Y = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=True)
    expected = layer.out_proj(tc.multihead.merge_heads(Y))
    torch.testing.assert_close(layer(X), expected, atol=1e-12, rtol=0)


def test_gqa_cache_holds_only_the_key_value_heads():
    torch.manual_seed(8)
    rope = ext.RotaryEmbedding(4)
    layer = ext.GroupedQueryAttention(16, 4, 1, causal=True, rope=rope).double().eval()
    X = torch.randn(2, 6, 16, dtype=f64)
    cache = tc.language_models.KVCache(10)
    steps = [layer(X[:, :3], cache=cache)] + [
        layer(X[:, n : n + 1], cache=cache) for n in range(3, 6)
    ]
    torch.testing.assert_close(torch.cat(steps, 1), layer(X), atol=1e-12, rtol=0)
    assert cache.K.shape == (2, 1, 10, 4)  # H_kv = 1 head, not H = 4
    measured = cache.K.numel() * cache.K.element_size() + cache.V.numel() * cache.V.element_size()
    assert measured == ext.kv_cache_bytes(1, 2, 1, 10, 4, f64)
    assert ext.kv_cache_bytes(6, 1, 6, 256, 64) == 2 * 6 * 6 * 256 * 64 * 4


def test_gqa_errors():
    with pytest.raises(ValueError, match="must divide H=4"):
        ext.GroupedQueryAttention(16, 4, 3)
    with pytest.raises(ValueError, match=r"expects \(B, N, 16\)"):
        ext.GroupedQueryAttention(16, 4, 2)(torch.randn(5, 16))


# ----------------------------------------------------------------------------------------------
# Online softmax and tiled attention


def test_online_softmax_equals_softmax_even_where_exp_overflows():
    S = torch.randn(5, 9, dtype=f64) * 10
    for shift in (0.0, 800.0, -800.0):
        torch.testing.assert_close(ext.online_softmax(S + shift), torch.softmax(S + shift, -1))
    assert torch.isinf(torch.exp(S + 800.0)).any()  # the naive form would overflow there


@pytest.mark.parametrize(
    ("N", "M", "causal", "bq", "bk"),
    [(50, 50, False, 16, 7), (50, 50, True, 16, 7), (50, 70, True, 13, 64), (5, 9, False, 64, 64),
     (1, 8, True, 1, 3)],
)  # fmt: skip
def test_tiled_attention_equals_softmax_attention(N, M, causal, bq, bk):
    torch.manual_seed(9)
    Q = torch.randn(2, 3, N, 8, dtype=f64)
    K, V = torch.randn(2, 2, 3, M, 8, dtype=f64)
    mask = causal_mask(N, M) if causal else None
    expected = scaled_dot_product_attention_reference(Q, K, V, mask)
    torch.testing.assert_close(
        ext.tiled_attention(Q, K, V, bq, bk, causal), expected, atol=1e-12, rtol=0
    )
    got32 = ext.tiled_attention(Q.float(), K.float(), V.float(), bq, bk, causal)
    torch.testing.assert_close(got32, expected.float(), atol=1e-5, rtol=0)


def test_tiled_attention_never_holds_the_score_matrix():
    N, d = 512, 16
    Q, K, V = torch.randn(3, 1, N, d).unbind(0)
    size, shape, _ = ext.largest_intermediate(
        lambda: scaled_dot_product_attention_reference(Q, K, V)
    )
    assert size == N * N * 4 and shape[-2:] == (N, N)
    size, shape, _ = ext.largest_intermediate(lambda: ext.tiled_attention(Q, K, V, 64, 64))
    assert size == N * d * 4  # the output itself; a tile is 64 x 64 = 4 KB x 4
    full = ext.peak_memory(lambda: scaled_dot_product_attention_reference(Q, K, V))
    tiled = ext.peak_memory(lambda: ext.tiled_attention(Q, K, V, 64, 64))
    assert full >= N * N * 4 and tiled < N * N * 4 / 4
    with pytest.raises(ValueError, match="block sizes"):
        ext.tiled_attention(Q, K, V, 0, 4)


# ----------------------------------------------------------------------------------------------
# Sliding windows


@pytest.mark.parametrize(("N", "w"), [(12, 4), (5, 8), (9, 1), (7, 7)])
def test_sliding_window_three_ways_and_its_cost(N, w):
    torch.manual_seed(10)
    Q, K, V = torch.randn(3, 2, 3, N, 4, dtype=f64).unbind(0)
    mask = ext.sliding_window_mask(N, w)
    assert int(mask.sum()) == ext.sliding_window_edges(N, w)
    assert ext.sliding_window_edges(N, w) == sum(min(n, w) for n in range(1, N + 1))
    banded = ext.sliding_window_attention_reference(Q, K, V, w)
    torch.testing.assert_close(ext.sliding_window_attention(Q, K, V, w), banded, atol=1e-12, rtol=0)
    torch.testing.assert_close(scaled_dot_product_attention_reference(Q, K, V, mask), banded)
    with FlopCounterMode(display=False) as flops:
        ext.sliding_window_attention_reference(Q[0, 0], K[0, 0], V[0, 0], w)
    assert flops.get_total_flops() == 4 * 4 * ext.sliding_window_edges(N, w)


def test_sliding_window_mask_in_the_course_layer():
    torch.manual_seed(11)
    layer = SelfAttention(8, 2).double()
    X = torch.randn(2, 10, 8, dtype=f64)
    Q, K, V = layer.project(X)
    expected = layer.out_proj(
        tc.multihead.merge_heads(ext.sliding_window_attention_reference(Q, K, V, 3))
    )
    torch.testing.assert_close(
        layer(X, ext.sliding_window_mask(10, 3)), expected, atol=1e-12, rtol=0
    )
    with pytest.raises(ValueError, match="at least the token"):
        ext.sliding_window_mask(4, 0)


# ----------------------------------------------------------------------------------------------
# The modern GPT

TINY_MODERN = ext.ModernGPTConfig(
    vocab_size=65, block_size=16, n_layers=2, H=4, d_model=32, H_kv=2, dropout=0.0
)


def test_modern_gpt_is_assembled_from_the_modern_parts():
    model = ext.ModernGPT(ext.MODERN_CPU)
    block = model.stack.blocks[0]
    assert (
        isinstance(block, tc.block.PreNormBlock)
        and type(block).forward is tc.block.PreNormBlock.forward
    )
    assert isinstance(block.norm1, ext.RMSNorm) and isinstance(model.stack.final_norm, ext.RMSNorm)
    assert isinstance(block.mlp, ext.SwiGLU) and block.attn.rope is not None
    assert not any("pos_emb" in name for name, _ in model.named_parameters())
    assert not any(name.endswith("bias") for name, _ in model.named_parameters())
    gpt = GPT(SHAKESPEARE_CPU)
    assert model.num_params() < gpt.num_params() < 1.05 * model.num_params()
    with pytest.raises(TypeError, match="ModernGPTConfig"):
        ext.ModernGPT(SHAKESPEARE_CPU)
    with pytest.raises(ValueError, match="must divide"):
        ext.ModernGPTConfig(H=4, d_model=32, H_kv=3)
    with pytest.raises(ValueError, match="must be even"):
        ext.ModernGPTConfig(H=4, d_model=12)
    with pytest.raises(TypeError, match="no counterpart"):
        block.load_from_torch(nn.TransformerEncoderLayer(128, 4))


def test_modern_gpt_is_causal_and_its_cache_decodes_the_same_tokens(tmp_path):
    torch.manual_seed(12)
    model = ext.ModernGPT(TINY_MODERN).eval()
    idx = torch.randint(0, 65, (2, 12))
    changed = idx.clone()
    changed[:, 7] = (changed[:, 7] + 1) % 65
    with torch.no_grad():
        a, b = model(idx)[0], model(changed)[0]
    torch.testing.assert_close(a[:, :7], b[:, :7])  # earlier positions cannot see token 7
    prompt = idx[:, :3]
    cached = generate(model, prompt, 40, greedy=True)  # beyond the context: the window jumps
    assert torch.equal(cached, generate(model, prompt, 40, greedy=True, use_cache=False))
    model.save(tmp_path / "m.pt", chars="abc")
    again, extra = ext.ModernGPT.load(tmp_path / "m.pt")
    assert extra == {"chars": "abc"} and again.config == TINY_MODERN
    torch.testing.assert_close(again(idx)[0], model(idx)[0])


@needs_data
def test_the_modern_preset_trains():
    recipe = LMRecipe(
        model=TINY_MODERN,
        train=TrainConfig(max_steps=20, lr=3e-3, warmup_steps=4, eval_interval=20),
        batch_size=16,
        eval_batches=2,
    )
    run = ext.train_modern_lm(recipe, "cpu", seed=0)
    losses = run.history.train_loss
    assert run.history.steps_done == 20
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3
    assert run.val_loss < math.log(65)  # better than the uniform guess


def test_rope_scheme_joins_the_length_experiment():
    claims = pytest.importorskip("transformer_course.claims")
    if not hasattr(claims, "length_generalisation") or not _has_data():
        pytest.skip("chapter claims' length_generalisation (and its data) is not available")
    result = claims.length_generalisation(
        {"sinusoidal": "sinusoidal", "rope": ext.rope_scheme}, seeds=[0], steps=2
    )
    assert set(result.variants) == {"sinusoidal", "rope"}
    assert math.isfinite(result.values("rope")[0])


# ----------------------------------------------------------------------------------------------
# The exercises' specifics


def test_exercise_solutions_are_the_package_functions():
    gen = torch.Generator().manual_seed(0)
    X, positions, base = ee._rope_inputs(gen, 0)
    torch.testing.assert_close(ee.rope(X, positions, base), ext.apply_rope(X, positions, base))
    X, gamma, eps = ee._rms_inputs(gen, 1)
    torch.testing.assert_close(ee.rms_norm(X, gamma, eps), ext.rms_norm_reference(X, gamma, eps))
    (S,) = ee._online_inputs(gen, 2)
    torch.testing.assert_close(ee.online_softmax(S), ext.online_softmax(S))
    Q, K, V = ee._gqa_inputs(gen, 0)
    n_rep = Q.shape[1] // K.shape[1]
    expected = scaled_dot_product_attention_reference(
        Q, ext.repeat_kv(K, n_rep), ext.repeat_kv(V, n_rep)
    )
    torch.testing.assert_close(ee.gqa(Q, K, V), expected)


def test_exercise_inputs_make_every_mistake_visible():
    for name in tc.exercises.list_exercises("extensions."):
        ex = tc.exercises._get(name)
        for trial in range(ex.trials):
            args = ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
            expected = ex.solution(*args)
            for mistake in ex.mistakes:
                got = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
                assert torch.isfinite(got).all(), (name, mistake.why)
                assert got.shape != expected.shape or not torch.allclose(got, expected), mistake.why
    (S,) = ee._online_inputs(torch.Generator().manual_seed(0), 0)
    naive = torch.exp(S) / torch.exp(S).sum(-1, keepdim=True)
    fb = tc.exercises.check(
        "extensions.online_softmax", lambda S: torch.exp(S) / torch.exp(S).sum(-1, keepdim=True)
    )
    assert torch.isnan(naive).any() and "NaN or inf" in fb.message
