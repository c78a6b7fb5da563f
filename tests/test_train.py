"""The training loop: it learns, its schedule, its time budget, its recipes and the evaluation mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_course.data import get_batch
from transformer_course.language_models import GPT, TINY
from transformer_course.runtime import eval_mode
from transformer_course.tokens import CharTokenizer
from transformer_course.train import Recipe, TrainConfig, lr_at, train


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
        model,
        lambda g: get_batch(ids, 32, 16, g),
        loss_fn,
        cfg,
        lambda m: {"val_loss": loss_fn(m, val)},
        False,
    )
    assert hist.steps_done == 60 and len(hist.evals["val_loss"]) == 2
    assert hist.evals["val_loss"][-1] < before - 1.0, (before, hist.evals)


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
    hist = train(model, lambda g: get_batch(ids, 32, 4, g), loss_fn, cfg, lambda m: {}, False)
    assert hist.steps_done < 10_000  # evaluating every step must not reset the budget
    assert 0.5 <= hist.seconds < 5.0


def test_evaluation_runs_in_eval_mode_without_gradients_and_restores_the_mode():
    model = GPT(dataclasses.replace(TINY, dropout=0.5))
    seen = []

    def evaluate(m):
        seen.append((m.training, torch.is_grad_enabled()))
        return {"x": 1.0}

    ids = torch.randint(0, 65, (500,), generator=torch.Generator().manual_seed(0))
    cfg = TrainConfig(max_steps=2, eval_interval=1)
    train(model, lambda g: get_batch(ids, 32, 2, g), lambda m, b: m(*b)[1], cfg, evaluate, False)
    assert seen == [(False, False), (False, False)] and model.training


def test_eval_mode_restores_the_mode_when_the_block_raises():
    model = GPT(TINY).train()
    with pytest.raises(RuntimeError, match="boom"), eval_mode(model):
        assert not model.training and not torch.is_grad_enabled()
        raise RuntimeError("boom")
    assert model.training and torch.is_grad_enabled()


def test_recipe_with_steps_changes_only_the_step_count():
    recipe = Recipe(train=TrainConfig(max_steps=100, lr=0.5), batch_size=7)
    short = recipe.with_steps(10)
    assert short.train.max_steps == 10 and short.train.lr == 0.5 and short.batch_size == 7
    assert recipe.with_steps(None) is recipe
    with pytest.raises(ValueError, match="steps must be >= 1"):
        recipe.with_steps(0)


# ----------------------------------------------------------------------------------------------
# What chapter *Training* added: the gradient norm, the history of a failed run, with_train, shard


def _tiny_run(cfg, model=None):
    torch.manual_seed(0)
    model = model or GPT(TINY)
    ids = torch.randint(0, 65, (800,), generator=torch.Generator().manual_seed(0))
    return model, train(
        model, lambda g: get_batch(ids, 16, 8, g), lambda m, b: m(*b)[1], cfg, progress=False
    )


def test_history_records_the_gradient_norm_before_clipping():
    from torch import nn

    from transformer_course.train import global_grad_norm

    cfg = TrainConfig(max_steps=3, lr=1e-3, warmup_steps=1, grad_clip=1e-3)
    _, hist = _tiny_run(cfg)
    assert len(hist.grad_norm) == 3 and all(n > 1e-3 for n in hist.grad_norm)  # unclipped norms
    # the first step's norm, recomputed: the same model, batch and loss
    torch.manual_seed(0)
    model = GPT(TINY)
    ids = torch.randint(0, 65, (800,), generator=torch.Generator().manual_seed(0))
    x, y = get_batch(ids, 16, 8, torch.Generator().manual_seed(0))
    model(x, y)[1].backward()
    first = global_grad_norm(model.parameters())
    assert abs(first.item() - hist.grad_norm[0]) < 1e-6 * first.item()
    assert abs(first - nn.utils.clip_grad_norm_(model.parameters(), float("inf"))) < 1e-6
    _, no_clip = _tiny_run(dataclasses.replace(cfg, grad_clip=None))
    assert len(no_clip.grad_norm) == 3 and no_clip.grad_norm[0] == pytest.approx(hist.grad_norm[0])


def test_a_run_that_blows_up_keeps_its_history():
    model = GPT(TINY)
    with torch.no_grad():
        model.lm_head.weight.mul_(float("inf"))  # the first loss is NaN
    with pytest.raises(FloatingPointError, match="lower the learning rate") as err:
        _tiny_run(TrainConfig(max_steps=5), model)
    assert err.value.history.steps_done == 0 and err.value.history.train_loss == []


def test_recipe_with_train_changes_only_the_named_settings():
    recipe = Recipe(train=TrainConfig(max_steps=100, lr=0.5), batch_size=7)
    changed = recipe.with_train(lr=0.1, warmup_steps=0)
    assert changed.train.lr == 0.1 and changed.train.warmup_steps == 0
    assert changed.train.max_steps == 100 and changed.batch_size == 7 and recipe.train.lr == 0.5
    with pytest.raises(ValueError, match="no setting"):
        recipe.with_train(learning_rate=0.1)


def test_shard_splits_the_global_batch_evenly_and_keeps_other_entries():
    from transformer_course.train import shard

    x, y = torch.arange(12).view(6, 2), torch.arange(6)
    parts = [shard((x, y, 0.5), r, 3) for r in range(3)]
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(parts[1][1], torch.tensor([2, 3])) and parts[2][2] == 0.5
    with pytest.raises(ValueError, match="does not split evenly over 4 ranks"):
        shard((x, y), 0, 4)
    with pytest.raises(ValueError, match="first dimension"):
        shard((x, torch.arange(5)), 0, 2)
