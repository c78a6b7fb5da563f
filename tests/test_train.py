"""The training loop: it learns, its schedule, its time budget, its recipes and the evaluation mode."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_course.data import get_batch
from transformer_course.language_models import GPT, TINY
from transformer_course.runtime import eval_mode
from transformer_course.tokens import CharTokenizer
from transformer_course.train import Recipe, TrainConfig, lr_at, shard, train
from transformer_course.training import ddp


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


# ----------------------------------------------------------------------------------------------
# Data parallelism with padded targets: eq-train-ddp needs equal numbers of *scored positions*


def _padded_batch():
    """A batch of 4 sequences of 3 positions whose targets are padded (-100) unevenly: the first
    half (rank 0's share) scores 6 positions, the second half (rank 1's) only 2."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 4, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (4, 3), generator=g)
    y[2, 1:], y[3, 1:] = -100, -100
    return x, y


def _padded_loss(m, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten(), ignore_index=-100)


def test_share_weights_make_the_ranks_mean_gradient_the_global_one_for_padded_batches():
    from torch import nn

    from transformer_course.train import shard, share_weight

    torch.manual_seed(0)
    model = nn.Linear(4, 5).double()
    batch = _padded_batch()

    def grad(loss):
        model.zero_grad()
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    g_global = grad(_padded_loss(model, batch))
    shares = [shard(batch, r, 2) for r in range(2)]
    n = [int((s[1] != -100).sum()) for s in shares]
    assert n == [6, 2]
    weighted = (
        sum(
            grad(share_weight(n[r], sum(n), 2) * _padded_loss(model, s))
            for r, s in enumerate(shares)
        )
        / 2
    )
    plain = sum(grad(_padded_loss(model, s)) for s in shares) / 2  # what DDP averages unweighted
    torch.testing.assert_close(weighted, g_global, rtol=0, atol=1e-12)
    assert (plain - g_global).abs().max() > 1e-3
    assert share_weight(8, 16, 2) == 1.0  # equal shares: no change
    with pytest.raises(ValueError, match="at least one position"):
        share_weight(0, 8, 2)


def _padded_worker(rank, world, store, out, with_scored):
    import torch.distributed as dist
    from torch import nn

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        model = nn.Linear(4, 5).double()
        cfg = TrainConfig(max_steps=3, lr=0.1, warmup_steps=1, weight_decay=0.0, grad_clip=None)
        scored = (lambda b: (b[1] != -100).sum()) if with_scored else None
        try:
            hist = train(
                model, lambda g: _padded_batch(), _padded_loss, cfg, progress=False, scored=scored
            )
            result = {
                "loss": hist.train_loss,
                "grad_norm": hist.grad_norm,
                "params": torch.cat([p.detach().flatten() for p in model.parameters()]),
            }
        except ValueError as err:
            result = {"error": str(err)}
        if rank == 0:
            torch.save(result, out)
    finally:
        dist.destroy_process_group()


def _run_two_ranks(tmp_path, with_scored):
    import torch.multiprocessing as mp

    out = tmp_path / f"rank0-{with_scored}.pt"
    for attempt in (1, 2):  # gloo's loopback connections can drop on a loaded machine: one retry
        store = tmp_path / f"store-{with_scored}-{attempt}"  # a new rendezvous file each time
        try:
            mp.spawn(_padded_worker, args=(2, str(store), str(out), with_scored), nprocs=2)
            break
        except mp.ProcessRaisedException as err:
            if attempt == 2 or not ddp.is_connection_failure(str(err)):
                raise
    return torch.load(out)


def test_two_ranks_with_padded_targets_train_like_one_process_or_refuse(tmp_path):
    from torch import nn

    torch.manual_seed(0)
    model = nn.Linear(4, 5).double()
    cfg = TrainConfig(max_steps=3, lr=0.1, warmup_steps=1, weight_decay=0.0, grad_clip=None)
    single = train(model, lambda g: _padded_batch(), _padded_loss, cfg, progress=False)
    ddp = _run_two_ranks(tmp_path, with_scored=True)
    assert ddp["loss"] == pytest.approx(single.train_loss, abs=1e-12)
    assert ddp["grad_norm"] == pytest.approx(single.grad_norm, abs=1e-12)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.testing.assert_close(ddp["params"], params, rtol=0, atol=1e-12)
    refused = _run_two_ranks(tmp_path, with_scored=False)  # padding would be weighted wrongly
    assert "pass scored=" in refused["error"]


# ----------------------------------------------------------------------------------------------
# Gradient accumulation (eq-train-accum): k micro-batches give the batch's gradient and update


def _gpt64_loss(m, batch):
    from transformer_course.training import cross_entropy

    x, y = batch
    return cross_entropy(m(x)[0], y)  # in float64 (the GPT's own loss is computed in float32)


def test_accumulated_micro_batches_give_the_batch_gradient_and_update_in_float64():
    from transformer_course.train import accumulate_backward

    ids = torch.randint(0, 65, (800,), generator=torch.Generator().manual_seed(0))
    batch = get_batch(ids, 16, 8, torch.Generator().manual_seed(1))

    def grads(k, **kwargs):
        torch.manual_seed(0)
        model = GPT(TINY).double()
        loss = accumulate_backward(model, _gpt64_loss, batch, k, **kwargs)
        return loss, torch.cat([p.grad.flatten() for p in model.parameters()])

    loss1, g1 = grads(1)
    for k in (2, 4, 8):
        loss_k, g_k = grads(k)
        torch.testing.assert_close(g_k, g1, rtol=0, atol=1e-12 * g1.abs().max().item())
        assert abs(loss_k.item() - loss1.item()) < 1e-12
    _, g_sum = grads(4, scored=lambda b: 1)  # equal weights, as without scored
    torch.testing.assert_close(g_sum, g1, rtol=0, atol=1e-12 * g1.abs().max().item())

    def trained(k):
        torch.manual_seed(0)
        model = GPT(TINY).double()
        cfg = TrainConfig(max_steps=6, lr=3e-3, warmup_steps=2, accumulate=k)
        hist = train(model, lambda g: get_batch(ids, 16, 8, g), _gpt64_loss, cfg, progress=False)
        return hist, torch.cat([p.detach().flatten() for p in model.parameters()])

    (h1, p1), (h4, p4) = trained(1), trained(4)
    assert max(abs(a - b) for a, b in zip(h1.train_loss, h4.train_loss, strict=True)) < 1e-12
    torch.testing.assert_close(p4, p1, rtol=0, atol=1e-12)  # six AdamW updates, the same
    torch.manual_seed(0)
    p0 = torch.cat([p.detach().flatten() for p in GPT(TINY).double().parameters()])
    assert (p1 - p0).abs().max() > 1e-3  # the updates are not vanishingly small


def test_padded_micro_batches_are_weighted_by_their_scored_positions():
    from torch import nn

    from transformer_course.train import accumulate_backward

    batch = _padded_batch()  # the two halves score 6 and 2 positions
    model = nn.Linear(4, 5).double()

    def grad(k, scored=None, divide=True):
        model.zero_grad()
        if divide:
            accumulate_backward(model, _padded_loss, batch, k, scored)
        else:  # the mistake: each micro-batch's mean loss backpropagated as it is
            for r in range(k):
                _padded_loss(model, shard(batch, r, k)).backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    def count(b):
        return (b[1] != -100).sum()

    whole = grad(1)
    torch.testing.assert_close(grad(2, count), whole, rtol=0, atol=1e-14)
    torch.testing.assert_close(grad(4, count), whole, rtol=0, atol=1e-14)
    assert (grad(2) - whole).abs().max() > 1e-3  # 1/k each: wrong when the counts differ
    assert (grad(2, divide=False) - whole).abs().max() > 1e-3  # not divided at all
    with pytest.raises(ValueError, match="does not split into 3 equal micro-batches"):
        accumulate_backward(model, _padded_loss, batch, 3, count)
    x, y = batch
    y = y.clone()
    y[3] = -100  # the last micro-batch of 4 scores nothing
    with pytest.raises(ValueError, match="every micro-batch must score at least one position"):
        accumulate_backward(model, _padded_loss, (x, y), 4, count)


def test_train_config_checks_its_new_settings():
    with pytest.raises(ValueError, match="accumulate must be >= 1"):
        TrainConfig(accumulate=0)
    with pytest.raises(ValueError, match="autocast must be one of"):
        TrainConfig(autocast="float16")
