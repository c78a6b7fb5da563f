"""The package on a GPU: the same equalities as on the CPU, within the tolerances of TF32/bf16 kernels.

Marked ``cuda`` and skipped without a CUDA device; the GPU workflow runs them (``pytest -m cuda``)."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.language_models import GPT, TINY, generate_with_logits

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def test_self_attention_on_cuda_equals_the_float64_reference_on_the_cpu():
    torch.manual_seed(0)
    layer = tc.multihead.SelfAttention(32, 4, causal=True).double()
    X = torch.randn(2, 9, 32, dtype=torch.float64)
    expected = layer(X)
    got = layer.float().cuda()(X.float().cuda())
    assert got.device.type == "cuda"
    torch.testing.assert_close(got.double().cpu(), expected, atol=2e-3, rtol=2e-3)  # TF32 matmuls


def test_cached_generation_on_cuda_equals_uncached():
    torch.manual_seed(1)
    model = GPT(TINY).cuda().eval()
    idx = torch.randint(0, TINY.vocab_size, (3, 5), device="cuda")
    a, la = generate_with_logits(model, idx, 40, greedy=True, use_cache=True)
    b, lb = generate_with_logits(model, idx, 40, greedy=True, use_cache=False)
    assert a.device.type == "cuda" and torch.equal(a, b)
    torch.testing.assert_close(la, lb, atol=1e-3, rtol=0)


def test_a_training_step_on_cuda_uses_bf16_autocast_and_learns():
    from transformer_course.data import get_batch
    from transformer_course.train import TrainConfig, train

    torch.manual_seed(2)
    model = GPT(TINY).cuda()
    ids = torch.randint(0, TINY.vocab_size, (4000,))
    hist = train(
        model,
        lambda g: get_batch(ids, 32, 8, g, "cuda"),
        lambda m, b: m(*b)[1],
        TrainConfig(max_steps=30, lr=3e-3, warmup_steps=5),
        progress=False,
    )
    assert next(model.parameters()).device.type == "cuda"
    assert hist.train_loss[-1] < hist.train_loss[0]
