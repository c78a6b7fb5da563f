"""The GPT: loss at initialisation, causality, the incremental property, masks, checkpoints."""

from __future__ import annotations

import math

import pytest
import torch

from transformer_course.attention import attention_weights, causal_mask
from transformer_course.conventions import turner_attention
from transformer_course.models import GPT, TINY, GPTConfig


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(TINY).eval()


def test_untrained_loss_is_log_vocab(model):
    g = torch.Generator().manual_seed(1)
    idx, targets = torch.randint(0, 65, (2, 16, 32), generator=g)
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(65)) < 0.05


def test_incremental_property(model):
    """Appending a token leaves the outputs at earlier positions unchanged (causality)."""
    idx = torch.randint(0, 65, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        short = model(idx[:, :8])[0]
        long = model(idx)[0]
        changed = idx.clone()
        changed[:, 8:] = (changed[:, 8:] + 1) % 65
        other = model(changed)[0]
    torch.testing.assert_close(long[:, :8], short, atol=1e-5, rtol=0)
    torch.testing.assert_close(other[:, :8], long[:, :8], atol=1e-5, rtol=0)
    assert not torch.allclose(other[:, 8:], long[:, 8:])


def test_turner_and_mit_causal_masks_are_the_same_mask():
    """Turner: A[n', n] upper-triangular, columns normalised. MIT: -inf above the diagonal of row scores."""
    torch.manual_seed(3)
    N, D, K = 6, 5, 3
    X = torch.randn(N, D, dtype=torch.float64)
    W_q, W_k = torch.randn(D, K, dtype=torch.float64), torch.randn(D, K, dtype=torch.float64)
    # MIT: S + M with M[n, m] = -inf for m > n, softmax over each row
    S = (X @ W_q) @ (X @ W_k).T / math.sqrt(K)
    M = torch.zeros(N, N, dtype=torch.float64).masked_fill(~causal_mask(N), float("-inf"))
    A_mit = torch.softmax(S + M, dim=-1)
    # Turner: column n may use rows n' <= n, i.e. keep the upper triangle of A[n', n]
    A_cols = turner_attention(X.T, W_q.T, W_k.T)
    logits_cols = torch.log(A_cols)  # undo the softmax up to a per-column constant
    upper = torch.ones(N, N, dtype=torch.bool).triu()
    A_turner = torch.softmax(logits_cols.masked_fill(~upper, float("-inf")), dim=0)
    torch.testing.assert_close(A_turner.T, A_mit, atol=1e-12, rtol=0)
    assert torch.equal(upper.T, causal_mask(N))  # the same mask, transposed
    torch.testing.assert_close(attention_weights(X @ W_q, X @ W_k, causal_mask(N)), A_mit)


def test_errors_are_explained(model):
    with pytest.raises(ValueError, match="exceed the context of 32"):
        model(torch.zeros(1, 33, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 65\)"):
        model(torch.full((1, 3), 70))
    with pytest.raises(ValueError, match=r"integer token ids of shape \(B, N\)"):
        model(torch.zeros(3, 4))
    with pytest.raises(ValueError, match="divisible by H"):
        GPTConfig(d_model=10, H=3)


def test_tied_weights_and_parameter_count():
    m = GPT(TINY)
    assert m.lm_head.weight is m.tok_emb.weight
    D, V, L, N = TINY.d_model, TINY.vocab_size, TINY.n_layers, TINY.block_size
    per_block = 4 * D * D + 4 * D + 2 * 4 * D * D + 4 * D + D + 4 * D  # attention + MLP + 2 norms
    assert m.num_params() == V * D + N * D + L * per_block + 2 * D


def test_checkpoint_round_trip(model, tmp_path):
    path = tmp_path / "gpt.pt"
    model.save(path, chars="abc")
    loaded, extra = GPT.load(path)
    assert extra == {"chars": "abc"} and loaded.config == model.config
    idx = torch.randint(0, 65, (1, 10))
    torch.testing.assert_close(loaded.eval()(idx)[0], model(idx)[0])
