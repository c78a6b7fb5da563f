"""Generation: the cached path reproduces the uncached one; sampling; prompts; a short training run."""

from __future__ import annotations

import pytest
import torch

from transformer_course.data import get_batch
from transformer_course.generate import (
    generate,
    generate_text,
    next_token,
    positions_processed,
    window_start,
)
from transformer_course.models import GPT, TINY
from transformer_course.tokens import CharTokenizer
from transformer_course.train import TrainConfig, lr_at, train


@pytest.fixture
def model():
    torch.manual_seed(0)
    return GPT(TINY).eval()


@pytest.mark.parametrize("prompt_len", [1, 5, 40])
def test_cached_equals_uncached_beyond_the_context(model, prompt_len):
    idx = torch.randint(0, 65, (2, prompt_len), generator=torch.Generator().manual_seed(1))
    a, la = generate(model, idx, 70, greedy=True, use_cache=True, return_logits=True)
    b, lb = generate(model, idx, 70, greedy=True, use_cache=False, return_logits=True)
    assert torch.equal(a, b)
    torch.testing.assert_close(la, lb, atol=1e-4, rtol=0)
    assert a.shape == (2, prompt_len + 70)


def test_sampling_with_the_same_seed_is_reproducible_and_cache_independent(model):
    idx = torch.zeros(1, 1, dtype=torch.long)
    runs = [
        generate(
            model,
            idx,
            40,
            temperature=0.8,
            top_k=5,
            use_cache=c,
            generator=torch.Generator().manual_seed(7),
        )
        for c in (True, False, True)
    ]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[0], runs[2])


def test_window_policy():
    assert [window_start(T, 8) for T in (1, 8, 9, 12, 13, 16, 17)] == [0, 0, 4, 4, 8, 8, 12]
    for T in range(1, 60):
        assert 0 < T - window_start(T, 8) <= 8


def test_next_token_rules():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    assert next_token(logits, greedy=True).item() == 1
    g = torch.Generator().manual_seed(0)
    draws = {next_token(logits, top_k=2, generator=g).item() for _ in range(200)}
    assert draws == {1, 3}  # only the two largest logits survive top-k
    with pytest.raises(ValueError, match="temperature must be > 0"):
        next_token(logits, temperature=0.0)


def test_prompts_with_unknown_characters_are_listed(model):
    tok = CharTokenizer.from_text("abcdefgh ")
    with pytest.raises(ValueError, match=r"'z', 'Q'"):
        generate_text(model, tok, "abz Q", 5)
    with pytest.raises(ValueError, match="prompt is empty"):
        generate_text(model, tok, "", 5)


def test_a_few_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    text = "to be or not to be, that is the question. " * 40
    tok = CharTokenizer.from_text(text)
    ids = torch.tensor(tok.encode(text))
    model = GPT(TINY.__class__(**{**TINY.__dict__, "vocab_size": tok.vocab_size}))
    val = get_batch(ids, 32, 16, torch.Generator().manual_seed(99))

    def loss_fn(m, batch):
        return m(*batch)[1]

    before = loss_fn(model.eval(), val).item()
    cfg = TrainConfig(max_steps=60, lr=3e-3, warmup_steps=10, eval_interval=30)
    hist = train(
        model, lambda g: get_batch(ids, 32, 16, g), loss_fn, cfg, lambda m: loss_fn(m, val), False
    )
    assert hist.steps_done == 60 and len(hist.eval_loss) == 2
    assert hist.eval_loss[-1] < before - 1.0, (before, hist.eval_loss)


def test_schedule():
    cfg = TrainConfig(max_steps=100, lr=1.0, min_lr=0.1, warmup_steps=10)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(10, cfg) == pytest.approx(1.0) and lr_at(99, cfg) == pytest.approx(0.1, abs=1e-3)
    assert all(lr_at(t, cfg) >= lr_at(t + 1, cfg) for t in range(10, 99))


def test_time_budget_counts_training_time_across_evaluations():
    torch.manual_seed(0)
    ids = torch.randint(0, 65, (2000,))
    model = GPT(TINY)

    def loss_fn(m, batch):
        return m(*batch)[1]

    cfg = TrainConfig(max_steps=10_000, eval_interval=1, time_budget_s=0.5)
    hist = train(model, lambda g: get_batch(ids, 32, 4, g), loss_fn, cfg, lambda m: 0.0, False)
    assert hist.steps_done < 10_000  # evaluating every step must not reset the budget
    assert 0.5 <= hist.seconds < 5.0


@pytest.mark.parametrize(
    "prompt_len,new,use_cache", [(1, 150, True), (1, 150, False), (40, 70, True), (5, 1, False)]
)
def test_positions_processed_counts_what_generate_runs(prompt_len, new, use_cache):
    model = GPT(TINY).eval()  # context 32: the window jumps several times
    seen = []
    hook = model.tok_emb.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[1]))
    idx = torch.zeros(1, prompt_len, dtype=torch.long)
    generate(model, idx, new, greedy=True, use_cache=use_cache)
    hook.remove()
    assert sum(seen) == positions_processed(prompt_len, new, TINY.block_size, use_cache)
    assert len(seen) == new  # one call per new token: the last token is never fed back
    with pytest.raises(ValueError, match="prompt_len"):
        positions_processed(0, 3, 8, True)


def test_zero_new_tokens_returns_the_prompt_and_negative_is_an_error():
    model = GPT(TINY).eval()
    idx = torch.zeros(2, 3, dtype=torch.long)
    out, logits = generate(model, idx, 0, greedy=True, return_logits=True)
    assert torch.equal(out, idx) and logits.shape == (2, 0, TINY.vocab_size)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(model, idx, -1)
