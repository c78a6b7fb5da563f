"""Chapter *Extensions*, ALiBi as a model: the attention layer and block equal the loop of book eq.
``eq-ext-alibi`` (float64 and float32), are causal, keep their shapes and their key-value cache, and
:func:`alibi_scheme` builds a model that differs from the no-position scheme only by the biases and
runs beyond its training length (the benchmark itself is ``bench/length.py``)."""

from __future__ import annotations

import math

import pytest
import torch

import transformer_course as tc
from transformer_course.block import PreNormBlock
from transformer_course.claims import ClaimsConfig, ClaimsLM, NoPositions
from transformer_course.extensions.alibi import (
    ALiBiBlock,
    ALiBiSelfAttention,
    alibi_attention_reference,
    alibi_scheme,
    alibi_slopes,
)
from transformer_course.language_models import KVCache
from transformer_course.multihead import SelfAttention, merge_heads

f64 = torch.float64


def _loop_layer(attn: ALiBiSelfAttention, X: torch.Tensor) -> torch.Tensor:
    """The layer by hand: its projections' weights, then the loop over heads and queries."""
    W = attn.in_proj.weight.detach().to(X)  # (3D, D): [W_q^T; W_k^T; W_v^T]
    b = attn.in_proj.bias.detach().to(X)
    D, H = attn.d_model, attn.H
    Q, K, V = ((X @ W[i * D : (i + 1) * D].T + b[i * D : (i + 1) * D]) for i in range(3))
    Q, K, V = (T.unflatten(-1, (H, D // H)).transpose(1, 2) for T in (Q, K, V))  # (B, H, N, d_k)
    Y = alibi_attention_reference(Q, K, V, alibi_slopes(H).to(X))  # (B, H, N, d_k)
    return merge_heads(Y) @ attn.out_proj.weight.detach().to(X).T + attn.out_proj.bias.to(X)


@pytest.mark.parametrize(("H", "N"), [(4, 9), (2, 1), (6, 5)])
def test_alibi_layer_equals_the_loop_in_float64(H, N):
    torch.manual_seed(0)
    attn = ALiBiSelfAttention(6 * H, H).double().eval()
    X = torch.randn(2, N, 6 * H, dtype=f64)
    torch.testing.assert_close(attn(X), _loop_layer(attn, X), atol=1e-10, rtol=0)


def test_alibi_layer_equals_the_loop_in_float32():
    torch.manual_seed(1)
    attn = ALiBiSelfAttention(32, 4).eval()
    X = torch.randn(3, 17, 32)
    torch.testing.assert_close(attn(X), _loop_layer(attn, X.double()).float(), atol=1e-5, rtol=0)


def test_alibi_layer_is_not_plain_attention_and_the_slopes_matter():
    torch.manual_seed(2)
    attn = ALiBiSelfAttention(16, 4).double().eval()
    plain = SelfAttention(16, 4, causal=True).double().eval()
    plain.load_state_dict(attn.state_dict())
    X = torch.randn(1, 12, 16, dtype=f64)
    assert (attn(X) - plain(X)).abs().max() > 1e-3  # the biases change the output
    attn.slopes.zero_()  # zero slopes: ALiBi's term vanishes and plain causal attention remains
    torch.testing.assert_close(attn(X), plain(X), atol=1e-12, rtol=0)


def test_alibi_layer_is_causal():
    torch.manual_seed(3)
    attn = ALiBiSelfAttention(16, 2).double().eval()
    X = torch.randn(2, 10, 16, dtype=f64)
    X2 = X.clone()
    X2[:, 6:] = torch.randn(2, 4, 16, dtype=f64)  # change the future of position 5
    torch.testing.assert_close(attn(X)[:, :6], attn(X2)[:, :6], atol=1e-12, rtol=0)
    assert (attn(X)[:, 6:] - attn(X2)[:, 6:]).abs().max() > 1e-3
    A = attn.attention_map(X)  # (B, H, N, N): rows sum to 1, nothing above the diagonal
    assert A.shape == (2, 2, 10, 10)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 2, 10, dtype=f64), atol=1e-12, rtol=0)
    assert A.triu(1).abs().max() == 0
    Q, K, V = attn.project(X)  # the map's weights are those the layer attends with
    torch.testing.assert_close(A @ V, alibi_attention_reference(Q, K, V, attn.slopes.double()),
                               atol=1e-12, rtol=0)  # fmt: skip


def test_alibi_layer_with_a_cache_equals_the_whole_sequence():
    torch.manual_seed(4)
    attn = ALiBiSelfAttention(16, 4).double().eval()
    X = torch.randn(2, 9, 16, dtype=f64)
    cache = KVCache(9)
    with torch.no_grad():
        steps = [attn(X[:, :4], cache=cache)] + [
            attn(X[:, n : n + 1], cache=cache) for n in range(4, 9)
        ]
    torch.testing.assert_close(torch.cat(steps, dim=1), attn(X), atol=1e-12, rtol=0)


def test_alibi_block_shapes_and_bad_input():
    torch.manual_seed(5)
    blk = ALiBiBlock(16, 4)  # causal by default
    assert isinstance(blk, PreNormBlock) and isinstance(blk.attn, ALiBiSelfAttention)
    assert blk.attn.causal and "slopes" not in dict(blk.named_parameters())  # fixed, not learned
    for N in (1, 7, 40):
        assert blk(torch.randn(3, N, 16)).shape == (3, N, 16)
    with pytest.raises(ValueError, match="causal"):
        ALiBiBlock(16, 4, causal=False)
    with pytest.raises(ValueError, match="mask=None"):
        blk(torch.randn(1, 4, 16), torch.ones(4, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="expects"):
        blk.attn(torch.randn(4, 16))


def test_alibi_scheme_differs_from_no_positions_only_by_the_biases():
    config = ClaimsConfig(vocab_size=11, block_size=8, max_len=32, n_layers=2, H=4, d_model=16)
    torch.manual_seed(6)
    model = alibi_scheme(config).double().eval()
    none = ClaimsLM(config, positions=NoPositions()).double().eval()
    assert isinstance(model.positions, NoPositions)
    assert all(isinstance(b, ALiBiBlock) for b in model.stack.blocks)
    assert model.num_params() == none.num_params()  # no position parameters at all
    none.load_state_dict(model.state_dict())
    idx = torch.randint(0, 11, (2, 20))
    assert (model(idx)[0] - none(idx)[0]).abs().max() > 1e-4
    for block in model.stack.blocks:
        block.attn.slopes.zero_()
    torch.testing.assert_close(model(idx)[0], none(idx)[0], atol=1e-12, rtol=0)


def test_alibi_model_runs_beyond_its_training_length():
    config = ClaimsConfig(vocab_size=11, block_size=8, max_len=32, n_layers=1, H=2, d_model=16)
    torch.manual_seed(7)
    model = alibi_scheme(config).eval()
    for N in (1, 8, 32, 100):  # up to max_len, and beyond it: the biases are built per call
        idx = torch.randint(0, 11, (2, N))
        logits, loss = model(idx, idx)
        assert logits.shape == (2, N, 11) and math.isfinite(loss.item())
    idx = torch.randint(0, 11, (1, 32))  # causal as a model: a prefix's logits ignore what follows
    torch.testing.assert_close(model(idx[:, :8])[0], model(idx)[0][:, :8], atol=1e-5, rtol=0)


def test_alibi_scheme_joins_the_length_experiment():
    try:
        tc.data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    result = tc.claims.length_generalisation(
        {"sinusoidal": "sinusoidal", "alibi": alibi_scheme}, seeds=[0], steps=2
    )
    assert result.variants == ["sinusoidal", "alibi"]
    (run,) = [r for r in result.runs if r.variant == "alibi"]
    C = tc.claims.SMALL.model.block_size
    assert len(run.extra["loss_by_position"]) == tc.claims.SMALL.length_factor * C
    assert math.isfinite(run.extra["loss_beyond"]) and math.isfinite(run.extra["loss_in_range"])
