"""Chapter *Training*: every equation's implementation against PyTorch's own, the two-process DDP run,
determinism, and the exercises' specifics (the scaling bench's quick mode is in test_bench.py)."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import subprocess

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

import transformer_course as tc
from transformer_course import training
from transformer_course.exercises import _get, check, list_exercises
from transformer_course.exercises import training as ex
from transformer_course.language_models import GPT, SHAKESPEARE_CPU_RECIPE, TINY
from transformer_course.train import TrainConfig, lr_at

ROOT = pathlib.Path(__file__).resolve().parents[1]

# ----------------------------------------------------------------------------------------------
# The objective (eq-train-ce, eq-train-lse)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(7, 5), (2, 6, 11), (3, 1, 4, 2)])
def test_cross_entropy_equals_torch_and_a_loop(dtype, shape):
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(*shape, generator=g, dtype=dtype)
    targets = torch.randint(0, shape[-1], shape[:-1], generator=g)
    ours = training.cross_entropy(logits, targets)
    ref = F.cross_entropy(logits.reshape(-1, shape[-1]), targets.reshape(-1))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ours, ref, atol=tol, rtol=tol)
    Z, y = logits.reshape(-1, shape[-1]).double(), targets.reshape(-1)
    loop = sum(
        math.log(sum(math.exp(v) for v in Z[p].tolist())) - Z[p, y[p]].item() for p in range(len(y))
    ) / len(y)
    assert abs(ours.item() - loop) < 10 * tol


def test_cross_entropy_ignores_padding_like_torch():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, 9, generator=g, dtype=torch.float64)
    targets = torch.randint(1, 9, (4, 6), generator=g)
    targets[0, 3:] = 0
    targets[2, 1:] = 0
    ours = training.cross_entropy(logits, targets, ignore_index=0)
    ref = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=0)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)
    assert abs(training.cross_entropy(logits, targets) - ours) > 1e-3  # counting padding differs


def test_cross_entropy_and_logsumexp_do_not_overflow():
    z = 1e4 + torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0, 1, 2, 3, 6])
    naive = torch.log(torch.exp(z).sum(-1))
    assert not torch.isfinite(naive).any()
    torch.testing.assert_close(training.logsumexp(z), torch.logsumexp(z, -1), atol=1e-12, rtol=0)
    torch.testing.assert_close(
        training.cross_entropy(z, t), F.cross_entropy(z, t), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(
        training.cross_entropy(z, t), training.cross_entropy(z - 1e4, t), atol=1e-10, rtol=0
    )  # shift invariance
    low = torch.tensor([[-1e4, -1e4 - 1.0]])  # exp underflows to 0 for both
    torch.testing.assert_close(training.logsumexp(low), torch.logsumexp(low, -1))
    inf_row = torch.tensor([[float("-inf"), float("-inf")], [0.0, float("-inf")]])
    torch.testing.assert_close(training.logsumexp(inf_row), torch.logsumexp(inf_row, -1))


def test_cross_entropy_gradient_equals_torch():
    z = torch.randn(6, 5, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 5, (6,))
    (g_ours,) = torch.autograd.grad(training.cross_entropy(z, t), z)
    (g_ref,) = torch.autograd.grad(F.cross_entropy(z, t), z)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-14, rtol=0)


def test_cross_entropy_errors_explain():
    z = torch.randn(3, 4)
    with pytest.raises(ValueError, match="shape of logits"):
        training.cross_entropy(z, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="integer class ids"):
        training.cross_entropy(z, torch.zeros(3))
    with pytest.raises(ValueError, match=r"lie in \[0, 4\)"):
        training.cross_entropy(z, torch.tensor([0, 1, 4]))
    with pytest.raises(ValueError, match="no position to score"):
        training.cross_entropy(z, torch.zeros(3, dtype=torch.long), ignore_index=0)
    with pytest.raises(ValueError, match="at least one entry"):
        training.logsumexp(torch.zeros(3, 0))


def test_gpt_loss_is_the_package_cross_entropy():
    """The teacher-forced loss of chapter 7 is eq. (eq-train-ce) over all B * N positions."""
    torch.manual_seed(0)
    model = GPT(TINY)
    x, y = torch.randint(0, 65, (2, 3, 10), generator=torch.Generator().manual_seed(3))
    logits, loss = model(x, y)
    torch.testing.assert_close(training.cross_entropy(logits, y), loss, atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------------------------
# Adam, AdamW, Adam + L2 (eq-train-adam, eq-train-adamw, eq-train-l2)


def _trajectories(torch_opt, package_step, wd, steps=25, betas=(0.9, 0.99), eps=1e-8):
    g = torch.Generator().manual_seed(4)
    shapes = [(4, 3), (5,), (2, 2, 2)]
    ref = [nn.Parameter(torch.randn(*s, generator=g, dtype=torch.float64)) for s in shapes]
    ours = [p.detach().clone() for p in ref]
    opt = torch_opt(ref, lr=1e-2, betas=betas, eps=eps, weight_decay=wd)
    state: dict = {}
    for s in range(1, steps + 1):
        grads = [torch.randn(*p.shape, generator=g, dtype=torch.float64) * (1 + s) for p in ref]
        for p, gr in zip(ref, grads, strict=True):
            p.grad = gr.clone()
        opt.step()
        package_step(ours, grads, state, 1e-2, betas, eps, wd, s)
    return torch.cat([p.detach().flatten() for p in ref]), torch.cat([p.flatten() for p in ours])


@pytest.mark.parametrize("wd", [0.0, 0.1, 0.5])
def test_adamw_step_equals_torch_adamw(wd):
    ref, ours = _trajectories(torch.optim.AdamW, training.adamw_step, wd)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("wd", [0.0, 0.1, 0.5])
def test_adam_l2_step_equals_torch_adam_with_weight_decay(wd):
    ref, ours = _trajectories(torch.optim.Adam, training.adam_l2_step, wd)
    torch.testing.assert_close(ours, ref, atol=1e-12, rtol=0)


def test_adamw_and_adam_l2_differ_only_with_decay():
    w_ref, _ = _trajectories(torch.optim.AdamW, training.adamw_step, 0.1)
    l2_ref, _ = _trajectories(torch.optim.Adam, training.adam_l2_step, 0.1)
    assert (w_ref - l2_ref).abs().max() > 1e-3
    w0, _ = _trajectories(torch.optim.AdamW, training.adamw_step, 0.0)
    l0, _ = _trajectories(torch.optim.Adam, training.adam_l2_step, 0.0)
    torch.testing.assert_close(w0, l0, atol=1e-14, rtol=0)


def test_first_adam_step_moves_each_coordinate_by_the_learning_rate():
    theta = [torch.zeros(100, dtype=torch.float64)]
    g = torch.exp(
        3 * torch.randn(100, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    )
    training.adamw_step(theta, [g], {}, lr=0.03, eps=1e-12, weight_decay=0.0, step=1)
    torch.testing.assert_close(theta[0], torch.full_like(g, -0.03), atol=1e-10, rtol=0)


def test_adam_errors_explain():
    p = [torch.zeros(3)]
    with pytest.raises(ValueError, match="counts the updates from 1"):
        training.adamw_step(p, [torch.zeros(3)], {}, lr=0.1, step=0)
    with pytest.raises(ValueError, match="1 parameters but 2 gradients"):
        training.adam_l2_step(p, [torch.zeros(3), torch.zeros(3)], {}, lr=0.1)
    with pytest.raises(ValueError, match="has shape"):
        training.adamw_step(p, [torch.zeros(4)], {}, lr=0.1)


# ----------------------------------------------------------------------------------------------
# The schedule (eq-train-schedule) against PyTorch's schedulers


def _torch_schedule(cfg: TrainConfig) -> list[float]:
    opt = torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=cfg.lr)
    min_lr = cfg.lr / 10 if cfg.min_lr is None else cfg.min_lr
    sched = SequentialLR(
        opt,
        [
            LinearLR(opt, 1 / cfg.warmup_steps, 1.0, total_iters=cfg.warmup_steps - 1),
            CosineAnnealingLR(opt, T_max=cfg.max_steps - cfg.warmup_steps, eta_min=min_lr),
        ],
        milestones=[cfg.warmup_steps],
    )
    out = []
    for _ in range(cfg.max_steps):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize(
    "cfg",
    [
        TrainConfig(max_steps=60, lr=1.0, warmup_steps=10),
        TrainConfig(max_steps=1000, lr=8e-3, warmup_steps=100),
        TrainConfig(max_steps=37, lr=3e-3, min_lr=0.0, warmup_steps=5),
        SHAKESPEARE_CPU_RECIPE.train,
    ],
)
def test_lr_at_equals_torch_sequential_lr(cfg):
    ours = [lr_at(step, cfg) for step in range(cfg.max_steps)]
    ref = _torch_schedule(cfg)
    assert max(abs(a - b) for a, b in zip(ours, ref, strict=True)) < 1e-12 * cfg.lr
    shifted = [cfg.lr * step / cfg.warmup_steps for step in range(cfg.warmup_steps)]
    assert max(abs(a - b) for a, b in zip(shifted, ref, strict=False)) > 1e-6 * cfg.lr


# ----------------------------------------------------------------------------------------------
# Clipping (eq-train-clip)


def test_clip_by_global_norm_equals_torch_and_keeps_the_direction():
    torch.manual_seed(0)
    model = GPT(TINY)
    x, y = torch.randint(0, 65, (2, 4, 8), generator=torch.Generator().manual_seed(6))
    (20 * model(x, y)[1]).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    clipped, norm = training.clip_by_global_norm(grads, 0.5)
    torch_norm = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    torch.testing.assert_close(norm, torch_norm)
    for a, p in zip(clipped, model.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad, atol=1e-9, rtol=1e-5)
    flat = torch.cat([c.flatten() for c in clipped]).double()
    orig = torch.cat([g.flatten() for g in grads]).double()
    assert (
        abs(flat.norm() - 0.5) < 1e-5 and abs(flat @ orig / (flat.norm() * orig.norm()) - 1) < 1e-9
    )
    per_tensor = torch.cat(
        [(g * min(1.0, 0.5 / g.norm().item())).flatten() for g in grads]
    ).double()
    assert per_tensor @ orig / (per_tensor.norm() * orig.norm()) < 0.999


def test_clip_leaves_small_gradients_and_inputs_alone():
    grads = [torch.tensor([0.3, 0.4])]  # norm 0.5
    clipped, norm = training.clip_by_global_norm(grads, 1.0)
    assert torch.equal(clipped[0], grads[0]) and clipped[0] is not grads[0] and norm.item() == 0.5
    clipped, _ = training.clip_by_global_norm(grads, 0.25)
    torch.testing.assert_close(clipped[0], torch.tensor([0.15, 0.2]))
    assert torch.equal(grads[0], torch.tensor([0.3, 0.4]))
    with pytest.raises(ValueError, match="must be > 0"):
        training.clip_by_global_norm(grads, 0.0)
    with pytest.raises(ValueError, match="no gradients"):
        training.clip_by_global_norm([], 1.0)


# ----------------------------------------------------------------------------------------------
# Initialisation, gradient noise


def test_residual_stream_rms_equals_hooks_and_scaling_is_depth_independent():
    torch.manual_seed(0)
    model = GPT(TINY).eval()
    idx = torch.randint(0, 65, (3, 16), generator=torch.Generator().manual_seed(7))
    seen = []
    hooks = [b.register_forward_hook(lambda m, i, o: seen.append(o)) for b in model.stack.blocks]
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    X0 = model.pos_emb(model.tok_emb(idx))
    expected = torch.stack([t.pow(2).mean().sqrt() for t in [X0, *seen]])
    torch.testing.assert_close(training.residual_stream_rms(model, idx), expected)


def test_per_example_grads_and_noise_scale():
    torch.manual_seed(0)
    model = GPT(TINY)
    x, y = torch.randint(0, 65, (2, 6, 8), generator=torch.Generator().manual_seed(8))
    examples = list(zip(x[:, None], y[:, None], strict=True))
    G = training.per_example_grads(model, lambda m, e: m(*e)[1], examples)
    assert G.shape == (6, model.num_params())
    model.zero_grad()
    model(x, y)[1].backward()  # the batch gradient is the mean of the examples' gradients
    batch = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.testing.assert_close(G.mean(0), batch, atol=1e-6, rtol=1e-5)
    Gd, n = G.double(), G.shape[0]
    tr_unbiased = ((Gd - Gd.mean(0)) ** 2).sum(1).sum() / (n - 1)  # sample covariance, 1/(n-1)
    g_sq = (Gd.mean(0) ** 2).sum() - tr_unbiased / n  # E||mean||^2 = ||g||^2 + tr(Sigma) / n
    est = training.gradient_noise_scale(G)
    assert abs(est.tr_sigma - tr_unbiased.item()) < 1e-9 * tr_unbiased.item()
    assert abs(est.g_sq - g_sq.item()) < 1e-9 * abs(g_sq.item())
    assert est.B_simple == pytest.approx((tr_unbiased / g_sq).item(), rel=1e-9)
    with pytest.raises(ValueError, match="n_ex >= 2"):
        training.gradient_noise_scale(G[:1])


def test_noise_scale_estimates_are_unbiased_where_the_plug_in_is_not():
    """Per-example gradients g + noise with a known covariance: averaged over many draws of 16
    examples, the estimates of ||g||^2 and tr(Sigma) are unbiased; the plug-in ||mean||^2 is too
    large by tr(Sigma) / 16."""
    gen = torch.Generator().manual_seed(0)
    d, n, draws = 50, 16, 4000
    g = torch.full((d,), 0.2, dtype=torch.float64)  # ||g||^2 = 2
    scale = torch.linspace(0.5, 1.5, d, dtype=torch.float64)  # tr(Sigma) = sum of squares
    tr_true, g_sq_true = (scale**2).sum().item(), (g**2).sum().item()
    G = g + scale * torch.randn(draws, n, d, generator=gen, dtype=torch.float64)
    ests = [training.gradient_noise_scale(G[i]) for i in range(draws)]
    g_sq_mean = np.mean([e.g_sq for e in ests])
    tr_mean = np.mean([e.tr_sigma for e in ests])
    plug_in = G.mean(1).pow(2).sum(-1).mean().item()
    se = np.std([e.g_sq for e in ests]) / draws**0.5
    assert abs(g_sq_mean - g_sq_true) < 4 * se
    assert abs(tr_mean / tr_true - 1) < 0.01
    assert plug_in - g_sq_true > 20 * se  # biased by tr(Sigma) / n
    assert abs(plug_in - g_sq_true - tr_true / n) < 4 * se


def test_noise_scale_two_batch_formulas_and_errors():
    tr, g_sq = 30.0, 2.0
    sq = {B: g_sq + tr / B for B in (4, 64)}  # exact expectations
    est = training.noise_scale_two_batch(sq[4], sq[64], 4, 64)
    assert est.tr_sigma == pytest.approx(tr) and est.g_sq == pytest.approx(g_sq)
    assert est.B_simple == pytest.approx(15.0)
    assert training.noise_scale_two_batch(3.0, 3.0 - 1e-9, 1, 2).B_simple > 0
    assert training.noise_scale_two_batch(10.0, 1.0, 1, 2).B_simple == float("inf")
    with pytest.raises(ValueError, match="B_small < B_big"):
        training.noise_scale_two_batch(1.0, 1.0, 8, 8)


# ----------------------------------------------------------------------------------------------
# Scaling laws (eq-train-power)


def test_fit_power_law_recovers_known_parameters():
    N = np.geomspace(1e4, 2e6, 6)
    for a, alpha, c in [(60.0, 0.45, 1.4), (5.0, 0.2, 0.8), (300.0, 0.7, 2.0)]:
        fit = training.fit_power_law(N, training.PowerLaw(a, alpha, c)(N))
        assert abs(fit.alpha - alpha) < 1e-5 and abs(fit.c - c) < 1e-5 and abs(fit.a / a - 1) < 1e-4


def test_fit_power_law_keeps_the_constant_a_loss_can_have():
    """Losses on a straight line in log size (the shape of the 160-step budget in the book): with
    c >= 0 every start converges (none stops at its evaluation limit) and the fit ends at the bound,
    c = 0 to the fit's tolerance, with the exponent of the points' log-log line. A law whose constant
    is positive keeps it."""
    import scipy.optimize

    N = np.geomspace(1.7e4, 1.3e6, 6)
    line = 2.95 - 0.04 * np.log(N)  # falls by 0.04 nats per e-fold of size, no bend
    calls = []
    real = scipy.optimize.least_squares

    def counted(*args, **kwargs):
        calls.append(real(*args, **kwargs))
        return calls[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(scipy.optimize, "least_squares", counted)
        fit = training.fit_power_law(N, line)
    assert 0 <= fit.c < 1e-3 and 0 < fit.alpha < 0.05
    assert all(c.status > 0 for c in calls), [c.status for c in calls]  # 0: the evaluation limit
    loglog = np.polyfit(np.log(N), np.log(line), 1)  # log L = log a - alpha log N, c = 0
    assert fit.alpha == pytest.approx(-loglog[0], rel=0.05)
    bent = training.fit_power_law(N, training.PowerLaw(5.0, 0.2, 0.8)(N))
    assert bent.c == pytest.approx(0.8, abs=1e-5)


def test_fit_power_law_errors_explain():
    with pytest.raises(ValueError, match="at least four points"):
        training.fit_power_law([1, 2, 3], [3, 2, 1])
    with pytest.raises(ValueError, match="positive"):
        training.fit_power_law([0, 1, 2, 3], [4, 3, 2, 1])
    with pytest.raises(ValueError, match="same length"):
        training.fit_power_law([1, 2, 3, 4], [4, 3, 2])


def test_scaling_analysis_predicts_held_out_sizes_of_an_exact_law():
    law = training.PowerLaw(40.0, 0.4, 1.5)
    runs = [
        {"steps": steps, "params": n, "val_loss": float(law(n)) + 1.0 / steps}
        for steps in (100, 200)
        for n in (2e4, 5e4, 1e5, 3e5, 6e5, 1.2e6)
    ]
    out = training.scaling_analysis(runs)
    assert set(out["fits"]) == {100, 200}
    assert abs(out["fits"][200]["alpha"] - 0.4) < 1e-4 and out["fits"][200]["rms_residual"] < 1e-6
    for held in out["held_out"].values():
        assert abs(held["error"]) < 1e-5
    assert out["held_out"]["interpolation"]["params"] == 3e5
    assert out["held_out"]["extrapolation"]["params"] == 1.2e6


def test_scaled_recipe_changes_only_size_and_budget():
    r = training.scaled_recipe(96, 3, 300, eval_batches=5)
    base = SHAKESPEARE_CPU_RECIPE
    assert (r.model.d_model, r.model.n_layers, r.model.H) == (96, 3, 6)
    assert (
        r.train.max_steps == 300 and r.train.eval_interval == 300 and r.train.time_budget_s is None
    )
    assert r.train.warmup_steps == base.train.warmup_steps == 100
    assert (r.train.lr, r.batch_size, r.model.block_size) == (base.train.lr, base.batch_size, 64)
    assert (
        r.eval_batches == 5
        and training.scaled_recipe(32, 1, 8, warmup_steps=2).train.warmup_steps == 2
    )
    with pytest.raises(ValueError, match="multiple of d_head"):
        training.scaled_recipe(40, 1, 200)
    with pytest.raises(ValueError, match="must exceed the 100 warm-up steps"):
        training.scaled_recipe(32, 1, 100)


# ----------------------------------------------------------------------------------------------
# Data parallelism: two processes under torchrun, and determinism


def test_two_process_ddp_matches_one_process_and_keeps_replicas_identical():
    """float64: the only difference from one process is the order of the gradient sums, ~1e-16
    relative per step (measured: 4e-16 after 20 steps), so 1e-12 is tight but safe."""
    ddp = training.launch_ddp_demo(nproc=2, steps=12, batch_size=16, dtype="float64")
    single = training.ddp_demo(steps=12, batch_size=16, dtype="float64")
    assert ddp["world_size"] == 2 and single["world_size"] == 1
    assert ddp["replicas_identical"] and ddp["replica_max_diff"] == 0.0
    np.testing.assert_allclose(ddp["losses"], single["losses"], atol=1e-12, rtol=0)
    np.testing.assert_allclose(ddp["grad_norms"], single["grad_norms"], atol=1e-12, rtol=0)
    np.testing.assert_allclose(ddp["val_losses"], single["val_losses"], atol=1e-12, rtol=0)
    assert len(ddp["val_losses"]) == 2
    assert single["losses"][-1] < single["losses"][0]
    assert "--nproc_per_node=2" in ddp["command"]


def test_launch_failure_is_reported(monkeypatch):
    def failed(command, **kwargs):  # what torchrun returns when a rank raises
        assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
        return subprocess.CompletedProcess(command, 1, "", "ValueError: does not split evenly")

    monkeypatch.setattr(subprocess, "run", failed)
    with pytest.raises(RuntimeError, match="torchrun exited with 1:\nValueError: does not split"):
        training.launch_ddp_demo(nproc=2, steps=2, batch_size=15)


def test_a_seeded_run_is_deterministic():
    a = training.ddp_demo(steps=5, batch_size=8)
    b = training.ddp_demo(steps=5, batch_size=8)
    assert a["losses"] == b["losses"] and a["grad_norms"] == b["grad_norms"]


# ----------------------------------------------------------------------------------------------
# The exercises


def test_all_exercises_are_registered():
    assert set(list_exercises("training.")) == {
        "training.adamw",
        "training.clip_by_global_norm",
        "training.cross_entropy",
        "training.lr_schedule",
        "training.resume",
        "training.train_steps",
        "training.accumulate",
    }


@pytest.mark.parametrize("name", list_exercises("training."))
def test_every_mistake_differs_from_the_solution_on_some_trial(name):
    exercise = _get(name)
    for mistake in exercise.mistakes:
        differs = []
        for trial in range(exercise.trials):
            args = exercise.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
            expected = exercise.solution(*args)
            got = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
            differs.append(got.shape != expected.shape or not torch.allclose(got, expected))
        assert any(differs), mistake.why


def test_exercise_solutions_equal_the_package_and_torch():
    g = torch.Generator().manual_seed(0)
    z, t = ex._ce_inputs(g, 1)
    torch.testing.assert_close(ex.cross_entropy(z, t), training.cross_entropy(z, t))
    torch.testing.assert_close(ex.cross_entropy(z, t), F.cross_entropy(z, t))
    theta0, grads, lr, b1, b2, eps, wd = ex._adam_inputs(g, 0)
    p = nn.Parameter(theta0.clone())
    opt = torch.optim.AdamW([p], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    path = []
    for gr in grads:
        p.grad = gr.clone()
        opt.step()
        path.append(p.detach().clone())
    torch.testing.assert_close(ex.adamw(theta0, grads, lr, b1, b2, eps, wd), torch.stack(path))
    steps, lr, min_lr, warmup, max_steps = ex._schedule_inputs(g, 0)
    cfg = TrainConfig(max_steps=max_steps, lr=lr, min_lr=min_lr, warmup_steps=warmup)
    expected = torch.tensor([lr_at(s, cfg) for s in steps.tolist()], dtype=torch.float64)
    torch.testing.assert_close(ex.lr_schedule(steps, lr, min_lr, warmup, max_steps), expected)
    grads, c = ex._clip_inputs(g, 0)
    ours = torch.cat([t.flatten() for t in training.clip_by_global_norm(grads, c)[0]])
    torch.testing.assert_close(ex.clip_by_global_norm(grads, c), ours)


def test_overflowing_answers_are_diagnosed_however_they_overflow():
    def naive_nan(z, t):  # exp(z) / sum: inf / inf = nan
        p = torch.exp(z) / torch.exp(z).sum(-1, keepdim=True)
        return -torch.log(p.gather(-1, t[:, None])).mean()

    def naive_inf(z, t):  # log(sum(exp)) = inf
        return (torch.log(torch.exp(z).sum(-1)) - z.gather(-1, t[:, None])[:, 0]).mean()

    for fn in (naive_nan, naive_inf):
        feedback = check("training.cross_entropy", fn)
        assert not feedback and "overflowed" in feedback.message, feedback.message
    feedback = check("training.cross_entropy", lambda z, t: torch.full((), float("nan")))
    assert "NaN or inf" in feedback.message  # an unrelated NaN keeps the generic message


def test_clip_exercise_is_not_fooled_by_in_place_clipping():
    def in_place(grads, c):  # like torch.nn.utils.clip_grad_norm_, which clips in place
        total = torch.sqrt(sum((g**2).sum() for g in grads))
        for g in grads:
            g.mul_(min(1.0, c / total.item()))
        return torch.cat([g.flatten() for g in grads])

    assert check("training.clip_by_global_norm", in_place)
    assert tc.exercises.check("training.clip_by_global_norm", ex.clip_by_global_norm)


def test_training_solutions_do_not_change_their_inputs():
    g = torch.Generator().manual_seed(3)
    W0, X, y, steps, lr, c = ex._step_inputs(g, 0)
    before = W0.clone()
    ex.train_steps(W0, X, y, steps, lr, c)
    assert torch.equal(W0, before)


@pytest.mark.parametrize("trial", range(3))
def test_resume_exercise_solution_equals_the_run_that_never_stopped(trial):
    args = ex._resume_inputs(torch.Generator().manual_seed(1000 + trial), trial)
    W0, X, y, _first, total, lr, p = args
    W, opt, gen = ex.toy_start(W0, lr, seed=0)
    for _ in range(total):
        ex.toy_step(W, opt, gen, X, y, p)
    assert torch.equal(ex.resume(*args), W.detach())


def test_checking_the_resume_exercise_leaves_the_lab_s_random_numbers_alone():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    assert check("training.resume", ex.resume)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("trial", range(3))
def test_accumulate_exercise_solution_is_the_whole_batch_gradient(trial):
    W0, X, y, k = ex._accumulate_inputs(torch.Generator().manual_seed(1000 + trial), trial)
    W = W0.clone().requires_grad_(True)
    F.cross_entropy(X @ W, y, ignore_index=-100).backward()
    torch.testing.assert_close(ex.accumulate(W0, X, y, k), W.grad, rtol=0, atol=1e-14)
    assert all(int((y_i != -100).sum()) > 0 for y_i in y.chunk(k))  # no empty micro-batch


# ----------------------------------------------------------------------------------------------
# Memory and FLOPs of a training step (eq-train-memory, eq-train-flops), predicted vs measured

WIDER = tc.language_models.GPTConfig(
    vocab_size=65, block_size=64, n_layers=3, H=4, d_model=64, dropout=0.0
)
ACCOUNTED = [(dataclasses.replace(TINY, dropout=0.0), 8, 32), (WIDER, 4, 48)]


@pytest.mark.parametrize("cfg, B, N", ACCOUNTED)
def test_parameters_activations_and_flops_are_predicted_exactly(cfg, B, N):
    torch.manual_seed(0)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 65, (2, B, N), generator=g)
    assert training.gpt_params(cfg) == model.num_params()
    memory = training.step_memory(cfg, B, N)
    assert training.saved_activation_bytes(model, lambda: model(x, y)[1]) == memory["activations"]
    flops = training.step_flops(cfg, B, N)
    counted = training.counted_flops(lambda: model(x, y)[1])
    assert counted["total"] == flops["total"] and counted["aten.bmm"] == flops["attention"]
    assert flops["six_n_d"] != flops["total"]  # 6|theta|BN is an estimate, not the count
    forward = training.counted_flops(lambda: model(x, y)[1], backward=False)["total"]
    assert 3 * forward == flops["total"]  # the backward pass costs twice the forward


@pytest.mark.parametrize("cfg, B, N", ACCOUNTED)
def test_the_measured_peak_of_a_step_is_within_ten_percent_of_the_prediction(cfg, B, N):
    torch.manual_seed(0)
    model = GPT(cfg)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 65, (2, B, N), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(x, y)[1].backward()
    opt.step()  # AdamW's moments now exist
    measured = training.peak_step_memory(model, opt, lambda: model(x, y)[1])
    predicted = training.step_memory(cfg, B, N)
    assert measured["resident"] == predicted["weights"] + predicted["adam"]
    assert abs(measured["peak"] / predicted["total"] - 1) < 0.1, (measured, predicted)
    assert measured["peak_above"] > predicted["activations"]  # the activations are all alive once


def test_accounting_refuses_dropout():
    with pytest.raises(ValueError, match="without dropout"):
        training.step_memory(dataclasses.replace(TINY, dropout=0.1), 2, 8)


# ----------------------------------------------------------------------------------------------
# bfloat16 autocast on the CPU: what is cast, what stays float32, and the loss it reaches


def test_cpu_autocast_casts_the_matrix_products_and_keeps_the_state_in_float32():
    from transformer_course.data import get_batch
    from transformer_course.train import train

    torch.manual_seed(0)
    model = GPT(TINY)
    ids = torch.randint(0, 65, (600,), generator=torch.Generator().manual_seed(0))
    seen: dict[str, set] = {}

    def record(module, inputs, output):
        seen.setdefault(type(module).__name__, set()).add(output.dtype)

    hooks = [
        m.register_forward_hook(record)
        for m in model.modules()
        if type(m) in (nn.Linear, tc.block.LayerNorm)
    ]
    losses = []

    def loss_fn(m, batch):
        loss = m(*batch)[1]
        losses.append(loss.dtype)
        return loss

    cfg = TrainConfig(max_steps=2, warmup_steps=1, autocast="bfloat16")
    train(model, lambda g: get_batch(ids, 16, 4, g), loss_fn, cfg, progress=False)
    for h in hooks:
        h.remove()
    assert seen == {"Linear": {torch.bfloat16}, "LayerNorm": {torch.float32}}
    assert set(losses) == {torch.float32}
    assert all(
        p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in model.parameters()
    )
    seen.clear()
    hooks = [m.register_forward_hook(record) for m in model.modules() if type(m) is nn.Linear]
    train(
        model, lambda g: get_batch(ids, 16, 4, g), loss_fn, TrainConfig(max_steps=1), progress=False
    )
    assert seen == {"Linear": {torch.float32}}  # the default, "auto", leaves the CPU alone
    for h in hooks:
        h.remove()


def test_cpu_autocast_trains_to_the_float32_loss_where_bf16_weights_do_not():
    from transformer_course.data import get_batch
    from transformer_course.train import train

    tok = tc.tokens.CharTokenizer.from_text(training.DEMO_TEXT)
    ids = tok.encode_tensor(training.DEMO_TEXT)
    held_out = get_batch(ids, 32, 16, torch.Generator().manual_seed(1))

    def run(autocast, dtype=torch.float32):
        torch.manual_seed(0)
        model = GPT(dataclasses.replace(TINY, vocab_size=tok.vocab_size)).to(dtype)
        cfg = TrainConfig(max_steps=60, lr=3e-3, warmup_steps=5, autocast=autocast)
        train(
            model, lambda g: get_batch(ids, 32, 16, g), lambda m, b: m(*b)[1], cfg, progress=False
        )
        with torch.no_grad():
            return model(*held_out)[1].item()

    fp32, mixed, pure_bf16 = run(None), run("bfloat16"), run(None, torch.bfloat16)
    assert abs(mixed - fp32) < 0.01 < abs(pure_bf16 - fp32), (fp32, mixed, pure_bf16)


# ----------------------------------------------------------------------------------------------
# The best learning rate and the IsoFLOP view (eq-train-vertex, eq-train-surface, eq-train-isoflop)


def test_log_parabola_minimum_finds_a_known_vertex_and_refuses_an_unbracketed_one():
    x = np.geomspace(1e-3, 1e-1, 7)
    y = 2.0 + 0.3 * (np.log(x) - np.log(7e-3)) ** 2
    fit = training.log_parabola_minimum(x, y)
    assert abs(fit.x_opt / 7e-3 - 1) < 1e-9 and abs(fit.y_opt - 2.0) < 1e-12
    u0, h = np.log(x[2]), np.log(2.0)  # the three-point form on a grid a factor 2 apart
    grid = np.exp(u0 + h * np.array([-1, 0, 1]))
    yy = 1.0 + (np.log(grid) - np.log(3e-3)) ** 2
    vertex = u0 + h * (yy[0] - yy[2]) / (2 * (yy[0] - 2 * yy[1] + yy[2]))
    assert abs(training.log_parabola_minimum(grid, yy).x_opt - np.exp(vertex)) < 1e-15
    with pytest.raises(ValueError, match="do not bracket a minimum"):
        training.log_parabola_minimum(x, -y)
    with pytest.raises(ValueError, match="at least three"):
        training.log_parabola_minimum(x[:2], y[:2])


def test_best_learning_rate_reads_the_vertex_and_handles_edges_and_divergence():
    lrs = [1e-3 * 2**k for k in range(6)]
    losses = [2.0 + 0.2 * (math.log(lr) - math.log(5e-3)) ** 2 for lr in lrs]
    best = training.best_learning_rate(lrs, losses)
    assert best["bracketed"] and abs(best["lr"] / 5e-3 - 1) < 1e-9 and best["grid_lr"] == 4e-3
    edge = training.best_learning_rate(lrs, sorted(losses))  # falls all the way: the first is best
    assert not edge["bracketed"] and edge["lr"] == 1e-3
    diverged = training.best_learning_rate(lrs, [*losses[:-1], None])  # the largest rate blew up
    assert diverged["bracketed"] and diverged["lr"] == best["lr"]


def _synthetic_runs(surface, sizes, tokens):
    return [
        {"params": n, "tokens": t, "flops": 6 * n * t, "val_loss": float(surface(n, t)), "steps": t}
        for n in sizes
        for t in tokens
    ]


def test_the_loss_surface_and_its_compute_optimal_size_are_recovered_from_synthetic_runs():
    truth = training.LossSurface(c=1.2, a=40.0, alpha=0.35, a_tok=300.0, alpha_tok=0.32)
    runs = _synthetic_runs(truth, np.geomspace(1e4, 2e6, 6), np.geomspace(3e5, 3e7, 4))
    fit, rms = training.fit_loss_surface(runs)
    assert rms < 1e-6 and abs(fit.zeta - truth.zeta) < 1e-3
    C = np.geomspace(1e12, 1e15, 4)
    np.testing.assert_allclose(fit.n_opt(C), truth.n_opt(C), rtol=1e-3)
    for c in C:  # the closed form is the minimum along 6 |theta| n_tok = C
        n = np.geomspace(truth.n_opt(c) / 30, truth.n_opt(c) * 30, 2001)
        assert abs(n[np.argmin(truth(n, c / (6 * n)))] / truth.n_opt(c) - 1) < 0.01


def test_the_loss_surface_keeps_a_constant_a_loss_can_have():
    """Runs that a surface with L_inf < 0 fits exactly end on the bound L_inf = 0 (a cross-entropy is
    never negative), with a residual the bound costs, not at a negative constant."""
    below = training.LossSurface(c=-0.5, a=40.0, alpha=0.35, a_tok=300.0, alpha_tok=0.32)
    runs = _synthetic_runs(below, np.geomspace(1e4, 2e6, 6), np.geomspace(3e5, 3e7, 4))
    assert min(r["val_loss"] for r in runs) > 0  # real losses, though the constant is negative
    fit, rms = training.fit_loss_surface(runs)
    assert fit.c >= 0 and fit.c < 1e-6 and rms > 1e-4


def test_isoflop_profiles_and_minima_find_the_known_frontier():
    truth = training.LossSurface(c=1.2, a=40.0, alpha=0.35, a_tok=300.0, alpha_tok=0.32)
    levels = np.geomspace(1e12, 1e14, 3)
    runs = []  # many sizes, each trained exactly at every level (an IsoFLOP design)
    for c in levels:
        sizes = truth.n_opt(c) * np.geomspace(1 / 8, 8, 9)
        runs += [{"params": int(n), "tokens": c / (6 * int(n)), "flops": c,
                  "val_loss": float(truth(int(n), c / (6 * int(n))))} for n in sizes]  # fmt: skip
    minima = training.isoflop_minima(training.isoflop_profiles(runs, levels))
    opt = [minima[float(c)]["params_opt"] for c in levels]
    assert all(minima[float(c)]["bracketed"] for c in levels)
    np.testing.assert_allclose(opt, truth.n_opt(levels), rtol=0.05)  # a parabola: near, not exact
    zeta, _ = training.fit_frontier(levels, opt)
    assert abs(zeta - truth.zeta) < 0.02
    # a study of a few fixed budgets per size meets few sizes at one level, and interpolates:
    # compute ranges 2e4: 1.2e11..4.8e11, 6e4: 3.6e11..1.44e12, 2e5: 1.2e12..4.8e12
    grid = _synthetic_runs(truth, [2e4, 6e4, 2e5], [1e6, 2e6, 4e6])
    between, exact, beyond = training.isoflop_profiles(grid, [4e11, 7.2e11, 2e13]).values()
    assert [(p["params"], p["measured"]) for p in between] == [(20000, False), (60000, False)]
    assert [(p["params"], p["measured"]) for p in exact] == [(60000, True)] and beyond == []
    u = (math.log(4e11) - math.log(2.4e11)) / (math.log(4.8e11) - math.log(2.4e11))
    assert abs(between[0]["loss"] - ((1 - u) * truth(2e4, 2e6) + u * truth(2e4, 4e6))) < 1e-12
    assert not training.isoflop_minima({4e11: between})[4e11]["bracketed"]
    with pytest.raises(ValueError, match="two budgets or more"):
        training.fit_frontier([1e12], [1e5])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_update_rounded_away_agrees_with_low_precision_arithmetic(dtype):
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(20000, generator=g) * 4).to(dtype)
    powers = torch.tensor([1.0, -1.0, 0.5, 2.0, -4.0], dtype=dtype).repeat(400)  # on a boundary
    w = torch.cat([w[w != 0], powers])
    delta = torch.randn(len(w), generator=g, dtype=torch.float64) * 10 ** torch.empty(
        len(w), dtype=torch.float64
    ).uniform_(-5, 0, generator=g)
    nu = torch.floor(torch.log2(w.abs().double()))
    half = 2.0 ** (nu - training.SIGNIFICAND_BITS[dtype])  # half the spacing above |w|
    clear = ((delta.abs() / half - 1).abs() > 1e-3) & ((delta.abs() / half - 0.5).abs() > 1e-3)
    w, delta = w[clear], delta[clear]  # near a tie, rounding through float32 first can decide it
    lost = (w.double() + delta).to(torch.float32).to(dtype) == w
    predicted = training.update_rounded_away(w, delta, dtype)
    assert torch.equal(predicted, lost) and 0.2 < lost.double().mean() < 0.8
    below = (w.abs() == 2.0 ** torch.floor(torch.log2(w.abs().double()))) & (delta * w.double() < 0)
    assert below.sum() > 100  # updates towards zero from a power of two were among them
    with pytest.raises(ValueError, match="no binary exponent"):
        training.update_rounded_away(torch.zeros(1), torch.ones(1))


def test_a_bf16_weight_at_a_power_of_two_takes_a_smaller_update_downwards():
    """Below 1 the bfloat16 numbers are 2^-8 apart, above it 2^-7: from a gain of exactly 1 an update
    of +0.003 is lost (< 2^-8), one of -0.003 is not (> 2^-9) and lands on 1 - 2^-8."""
    one = torch.ones(4, dtype=torch.bfloat16)
    delta = torch.tensor([0.003, -0.003, -(2.0**-9), -(2.0**-9) * 1.01], dtype=torch.float64)
    after = (one.double() + delta).to(torch.bfloat16)
    assert after.tolist() == [1.0, 1 - 2.0**-8, 1.0, 1 - 2.0**-8]  # a tie rounds to the even 1
    assert training.update_rounded_away(one, delta).tolist() == [True, False, True, False]
    assert training.update_rounded_away(-one, -delta).tolist() == [True, False, True, False]
    strictly_inside = torch.full((2,), 1.5, dtype=torch.bfloat16)  # 2^-7 apart on both sides
    assert training.update_rounded_away(strictly_inside, delta[:2]).tolist() == [True, True]


def test_only_a_failed_connection_between_ranks_is_retried():
    from transformer_course.training import ddp

    seen = (
        "[E1124 13:49:21 ProcessGroupGloo.cpp:67] Gloo connectFullMesh failed with [pair.cc:553] "
        "Connection closed by peer [127.0.0.1]:24195."
    )  # as a loaded 2-core machine printed it
    assert ddp.is_connection_failure(seen)
    assert not ddp.is_connection_failure("ValueError: pass scored= to weight padded targets")
    assert not ddp.is_connection_failure(None)
