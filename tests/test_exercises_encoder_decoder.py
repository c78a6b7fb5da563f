"""Exercises of the *Encoder-decoder* lab: each solution passes its checker, each listed mistake is
diagnosed with its own explanation, and the solutions agree with what the package's Seq2Seq does."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import encoder_decoder as ee
from transformer_course.models import Seq2Seq, Seq2SeqConfig
from transformer_course.multihead import MultiHeadAttention, multi_head_attention_reference
from transformer_course.tasks import DateTask

NAMES = [
    "ed.shift_targets",
    "ed.key_padding_mask",
    "ed.cross_attention",
    "ed.causal_padding_mask",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("ed.") == sorted(NAMES)


@pytest.mark.parametrize("name", ["ed.key_padding_mask", "ed.causal_padding_mask"])
def test_masks_are_accepted_as_bool_and_unknown_wrong_masks_are_explained(name):
    ex = tc.exercises._get(name)
    bool_solution = ex.solution.__wrapped__
    args = ex.make_inputs(torch.Generator().manual_seed(0), 0)
    assert bool_solution(*args).dtype == torch.bool
    assert tc.exercises.check(name, bool_solution)
    assert tc.exercises.check(name, lambda *a: bool_solution(*a).long())  # 0/1 integers are fine

    def all_true(tokens, pad_id):  # wrong in a way no listed mistake describes
        B, N = tokens.shape
        return torch.ones(B, N, N, dtype=torch.bool)

    feedback = tc.exercises.check(name, all_true)
    assert feedback.status == "incorrect" and "values differ" in feedback.message


def test_solution_prints_the_bool_function():
    text = tc.exercises.solution("ed.key_padding_mask")
    assert text.startswith("def key_padding_mask") and "expand" in text
    assert "as_float" not in text


def test_shift_matches_the_date_task_slices():
    task = DateTask()
    _, tgt = task.tensors(task.sample(6, seed=0))  # (B, tgt_len) = [BOS, y, EOS]
    y = tgt[:, 1:]
    tgt_in, tgt_out = ee.shift_targets(y, task.BOS)
    assert torch.equal(tgt_in, tgt[:, :-1]) and torch.equal(tgt_out, tgt[:, 1:])


def test_key_padding_mask_is_the_mask_the_encoder_uses():
    task = DateTask()
    src, _ = task.tensors(task.sample(5, seed=1))
    torch.manual_seed(0)
    model = Seq2Seq(
        Seq2SeqConfig(task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, d_model=16, H=2)
    ).eval()
    mask = ee.key_padding_mask.__wrapped__(src, task.PAD)
    _, keep = model.encode(src)
    assert torch.equal(mask, keep[:, None, :].expand_as(mask))
    with torch.no_grad():  # the first encoder block, run with the exercise's mask
        H0 = model.src_pos(model.src_emb(src))
        torch.testing.assert_close(
            model.encoder[0](H0, mask=mask),
            model.encoder[0](H0, mask=keep[:, None, :].expand(-1, src.shape[1], -1)),
        )


def test_cross_attention_solution_equals_the_package_module():
    g = torch.Generator().manual_seed(3)
    B, N, M, D, H = 2, 5, 7, 8, 2
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    mha = MultiHeadAttention(D, H, bias=False).double()
    W = mha.weights
    ours = ee.cross_attention(X, memory, W["W_q"], W["W_k"], W["W_v"], W["W_o"], H)
    with torch.no_grad():
        torch.testing.assert_close(ours, mha(X, memory), atol=1e-12, rtol=0)
        ref = multi_head_attention_reference(X, W["W_q"], W["W_k"], W["W_v"], W["W_o"], H, Z=memory)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


def test_causal_padding_mask_is_what_multihead_attention_combines():
    g = torch.Generator().manual_seed(4)
    tokens = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 0, 0]])
    mask = ee.causal_padding_mask.__wrapped__(tokens, 0)
    expected = torch.tensor(
        [
            [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]],
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    mha = MultiHeadAttention(8, 2).double().eval()
    X = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    key_mask = (tokens != 0)[:, None, :].expand(-1, 5, -1)
    with torch.no_grad():  # the module combines a key mask with causal=True by &
        torch.testing.assert_close(mha(X, mask=mask), mha(X, mask=key_mask, causal=True))
