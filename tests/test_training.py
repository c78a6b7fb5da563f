"""Chapter *Training*: every equation's implementation against PyTorch's own, the two-process DDP run,
determinism, and the exercises' specifics (the scaling bench's quick mode is in test_bench.py)."""

from __future__ import annotations

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
        "training.train_steps",
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
