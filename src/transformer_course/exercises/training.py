"""Exercises of the *Training* lab: a stable cross-entropy, AdamW, the warm-up and cosine schedule,
clipping by the global norm, the training step (in the spirit of the first assignment of Stanford's
CS336, Hashimoto & Liang 2025), resuming a run from a checkpoint, and gradient accumulation.

Chapter: *Training* (Kingma & Ba 2015; Loshchilov & Hutter 2019; Pascanu et al. 2013). Each checker
compares an answer with the exercise's reference solution (below); ``tests/test_training.py`` checks
those solutions against PyTorch and the package. Every input is
float64 so the checkers can be strict. Some inputs hold logits of size 1000, where a log-sum-exp that
does not subtract the maximum overflows: such an answer is compared with the known mistake entry by
entry, infinities included (:class:`_OverflowAware`), so the learner reads *why* it overflowed.
"""

from __future__ import annotations

import io
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from . import _REGISTRY, Exercise, Mistake, exercise, randn

# ---------------------------------------------------------------------------------------------------
# An exercise whose known mistakes may overflow


class _OverflowAware(Exercise):
    """An :class:`Exercise` that compares a non-finite answer with the known mistakes before it reports
    NaN or inf in general: a mistake matches when it is non-finite in the same places (an overflow may
    give inf or NaN depending on how the formula is written) and close elsewhere.
    """

    def _compare(self, got: Any, expected: Tensor, args: tuple) -> str | None:
        if isinstance(got, Tensor) and got.shape == expected.shape:
            got64 = got.detach().to(expected.dtype)
            bad = ~torch.isfinite(got64)
            if bad.any():
                for mistake in self.mistakes:
                    wrong = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
                    if (
                        wrong.shape == got64.shape
                        and torch.equal(~torch.isfinite(wrong), bad)
                        and torch.allclose(got64[~bad], wrong[~bad], atol=self.atol, rtol=self.rtol)
                    ):
                        return mistake.why
        return super()._compare(got, expected, args)


def _register(**kwargs: Any):
    """Like :func:`.exercise`, for an :class:`_OverflowAware` exercise."""

    def register(fn):
        ex = _OverflowAware(solution=fn, **kwargs)
        if ex.name in _REGISTRY:
            raise ValueError(f"exercise {ex.name!r} is defined twice")
        _REGISTRY[ex.name] = ex
        return fn

    return register


# ---------------------------------------------------------------------------------------------------
# 1. The cross-entropy, stably (book eqs. eq-train-ce and eq-train-lse)


def _ce_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor]:
    B, K, offset = ((4, 5, 0.0), (6, 7, 1000.0), (3, 9, -1000.0))[trial % 3]
    logits = 3.0 * randn(gen, B, K) + offset  # trial 1: exp(z) overflows; trial 2: it underflows
    if trial % 3:
        logits[0] += 800.0  # and one row larger still
    return logits, torch.randint(0, K, (B,), generator=gen)


def _naive_ce(z: Tensor, y: Tensor) -> Tensor:
    p = torch.exp(z) / torch.exp(z).sum(dim=-1, keepdim=True)  # overflows for z > 709
    return -torch.log(p.gather(-1, y[:, None])[:, 0]).mean()


def _lse_no_max_back(z: Tensor, y: Tensor) -> Tensor:
    m = z.max(dim=-1, keepdim=True).values
    lse = torch.log(torch.exp(z - m).sum(dim=-1))  # the maximum is never added back
    return (lse - z.gather(-1, y[:, None])[:, 0]).mean()


@_register(
    name="training.cross_entropy",
    prompt=(
        "logits is a (B, K) tensor (one row of K class scores per example) and targets a (B,) tensor "
        "of class ids. Return the mean cross-entropy, the mean over rows of "
        "logsumexp(logits[b]) - logits[b, targets[b]], a scalar tensor. Compute the log-sum-exp "
        "yourself, stably: subtract each row's maximum before exp and add it back after the log. Some "
        "logits are around 1000."
    ),
    make_inputs=_ce_inputs,
    mistakes=[
        Mistake(
            "exp overflowed or underflowed: e^z is inf for z > 709 in float64 (z > 88 in float32) "
            "and 0 for z < -745, so the softmax became inf/inf or 0/0. Subtract each row's maximum "
            "m before exp and add it back after the log: "
            "logsumexp(z) = m + log(sum(exp(z - m))).",
            _naive_ce,
        ),
        Mistake(
            "you subtracted the row maximum m inside the exp but did not add it back: "
            "logsumexp(z) = m + log(sum(exp(z - m))).",
            _lse_no_max_back,
        ),
        Mistake(
            "you summed the losses of the B examples; the cross-entropy is their mean (so the step "
            "size does not grow with the batch).",
            lambda z, y: F.cross_entropy(z, y, reduction="sum"),
        ),
        Mistake(
            "the sign is wrong: the loss is -log p(target) = logsumexp(z) - z[target], which is >= 0.",
            lambda z, y: -F.cross_entropy(z, y),
        ),
        Mistake(
            "the log-sum-exp ran over the batch (dim=0) instead of the K classes of each row (dim=-1).",
            lambda z, y: (torch.logsumexp(z, dim=0)[y] - z.gather(-1, y[:, None])[:, 0]).mean(),
        ),
    ],
)
def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    m = logits.max(dim=-1, keepdim=True).values  # (B, 1): each row's largest logit
    lse = m[:, 0] + torch.log(torch.exp(logits - m).sum(dim=-1))  # (B,), every exponent <= 0
    picked = logits.gather(-1, targets[:, None])[:, 0]  # (B,): the target's logit
    return (lse - picked).mean()


# ---------------------------------------------------------------------------------------------------
# 2. AdamW (book eqs. eq-train-adam and eq-train-adamw)


def _adam_inputs(gen: torch.Generator, trial: int) -> tuple:
    n_updates, n = ((5, 4), (7, 6), (4, 8))[trial % 3]  # updates, parameters
    theta0 = randn(gen, n)
    scales = torch.exp(randn(gen, n))  # coordinates with gradients of different sizes
    grads = scales * randn(gen, n_updates, n)  # (n_updates, n): the gradient at each update, given
    lr, beta1, beta2, eps, wd = ((0.1, 0.9, 0.99, 1e-2, 0.1), (0.05, 0.8, 0.95, 1e-2, 0.3),
                                 (0.2, 0.9, 0.999, 5e-2, 0.05))[trial % 3]  # fmt: skip
    return theta0, grads, lr, beta1, beta2, eps, wd


def _adam(theta0, grads, lr, beta1, beta2, eps, wd, *, correct=True, l2=False, lr_decay=True,
          eps_inside=False, shift=0):  # fmt: skip
    theta, m, c = theta0.clone(), torch.zeros_like(theta0), torch.zeros_like(theta0)
    out = []
    for u, g in enumerate(grads, start=1):
        if l2:
            g = g + wd * theta
        m = beta1 * m + (1 - beta1) * g
        c = beta2 * c + (1 - beta2) * g * g
        m_hat = m / (1 - beta1 ** (u + shift)) if correct else m
        c_hat = c / (1 - beta2 ** (u + shift)) if correct else c
        step = m_hat / (torch.sqrt(c_hat + eps) if eps_inside else torch.sqrt(c_hat) + eps)
        decay = 0.0 if l2 else (lr * wd * theta if lr_decay else wd * theta)
        theta = theta - lr * step - decay
        out.append(theta)
    return torch.stack(out)


@exercise(
    name="training.adamw",
    prompt=(
        "theta0 is a (n,) vector of n parameters and grads a (n_updates, n) tensor: grads[u - 1] is "
        "the gradient g_u used at update u = 1..n_updates (given, so that your answer can be compared "
        "exactly). Run the AdamW updates from theta0 with moments m_0 = c_0 = 0: "
        "m_u = beta1 m + (1 - beta1) g_u, c_u = beta2 c + (1 - beta2) g_u^2, "
        "bias-corrected m_hat = m_u / (1 - beta1^u), "
        "c_hat = c_u / (1 - beta2^u), then theta_u = theta_{u-1} - lr (m_hat / (sqrt(c_hat) + eps) "
        "+ wd theta_{u-1}). Return every theta_u stacked, shape (n_updates, n)."
    ),
    make_inputs=_adam_inputs,
    mistakes=[
        Mistake(
            "no bias correction: m_u and c_u start at 0, so early on they underestimate the moments; "
            "divide them by 1 - beta1^u and 1 - beta2^u.",
            lambda *a: _adam(*a, correct=False),
        ),
        Mistake(
            "this is Adam with an L2 penalty: you added wd * theta to the gradient, so the decay went "
            "through the moments and was divided by sqrt(c_hat). AdamW decouples it: subtract "
            "lr * wd * theta_{u-1} from theta separately.",
            lambda *a: _adam(*a, l2=True),
        ),
        Mistake(
            "the weight decay is not multiplied by the learning rate: subtract lr * wd * theta, not "
            "wd * theta (as torch.optim.AdamW does).",
            lambda *a: _adam(*a, lr_decay=False),
        ),
        Mistake(
            "eps is inside the square root: divide by sqrt(c_hat) + eps, not sqrt(c_hat + eps).",
            lambda *a: _adam(*a, eps_inside=True),
        ),
        Mistake(
            "the bias correction is one step off: the first update is u = 1, so it divides by "
            "1 - beta1^1 (not 1 - beta1^2).",
            lambda *a: _adam(*a, shift=1),
        ),
    ],
)
def adamw(
    theta0: Tensor, grads: Tensor, lr: float, beta1: float, beta2: float, eps: float, wd: float
) -> Tensor:
    theta = theta0.clone()
    m, c = torch.zeros_like(theta0), torch.zeros_like(theta0)  # m_0 = c_0 = 0
    out = []
    for u, g in enumerate(grads, start=1):  # updates count from 1
        m = beta1 * m + (1 - beta1) * g
        c = beta2 * c + (1 - beta2) * g**2
        m_hat, c_hat = m / (1 - beta1**u), c / (1 - beta2**u)
        theta = theta - lr * (m_hat / (torch.sqrt(c_hat) + eps) + wd * theta)  # decoupled decay
        out.append(theta)
    return torch.stack(out)  # (n_updates, n)


# ---------------------------------------------------------------------------------------------------
# 3. The learning-rate schedule of the course's loop (book eq. eq-train-schedule)


def _schedule_inputs(gen: torch.Generator, trial: int) -> tuple:
    lr, min_lr, warmup, max_steps = ((1.0, 0.1, 5, 30), (3e-3, 1e-4, 10, 40), (0.5, 0.05, 3, 12))[
        trial % 3
    ]
    return torch.arange(max_steps), lr, min_lr, warmup, max_steps


def _schedule(steps, lr, min_lr, warmup, max_steps, *, warm_shift=1, cos_shift=0, total=None,
              floor=None):  # fmt: skip
    out = []
    for t in steps.tolist():
        if t < warmup:
            out.append(lr * (t + warm_shift) / warmup)
        else:
            span = (max_steps - warmup) if total is None else total
            progress = min(1.0, (t - warmup + cos_shift) / span)
            low = min_lr if floor is None else floor
            out.append(low + 0.5 * (lr - low) * (1 + math.cos(math.pi * progress)))
    return torch.tensor(out, dtype=torch.float64)


@exercise(
    name="training.lr_schedule",
    prompt=(
        "steps holds the loop's step numbers 0, 1, ..., max_steps - 1 (a tensor). Return the "
        "learning rate of each step as tc.train.lr_at computes it, a float64 tensor of the same "
        "length: linear warm-up lr * (step + 1) / warmup for step < warmup, then cosine decay "
        "min_lr + (lr - min_lr) (1 + cos(pi p)) / 2 with p = (step - warmup) / (max_steps - warmup)."
    ),
    make_inputs=_schedule_inputs,
    mistakes=[
        Mistake(
            "the warm-up is one step late: at step 0 it gives lr * 0 / warmup = 0, an update that "
            "does nothing. The loop's step t is update t + 1, so the warm-up is lr * (t + 1) / warmup.",
            lambda *a: _schedule(*a, warm_shift=0),
        ),
        Mistake(
            "the cosine is one step early: its progress must be 0 at step = warmup (so the peak lr is "
            "used there), p = (step - warmup) / (max_steps - warmup), not (step - warmup + 1) / ....",
            lambda *a: _schedule(*a, cos_shift=1),
        ),
        Mistake(
            "the cosine runs over all max_steps instead of the max_steps - warmup steps after the "
            "warm-up: p = (step - warmup) / (max_steps - warmup).",
            lambda *a: _schedule(*a, total=a[4]),
        ),
        Mistake(
            "the cosine decays to 0 instead of min_lr: min_lr + (lr - min_lr) (1 + cos(pi p)) / 2.",
            lambda *a: _schedule(*a, floor=0.0),
        ),
    ],
)
def lr_schedule(steps: Tensor, lr: float, min_lr: float, warmup: int, max_steps: int) -> Tensor:
    t = steps.double()
    warm = lr * (t + 1) / warmup  # update t + 1 of the warm-up
    progress = ((t - warmup) / max(1, max_steps - warmup)).clamp(0.0, 1.0)
    cosine = min_lr + 0.5 * (lr - min_lr) * (1 + torch.cos(math.pi * progress))
    return torch.where(t < warmup, warm, cosine)


# ---------------------------------------------------------------------------------------------------
# 4. Clipping by the global norm (book eq. eq-train-clip)


def _clip_inputs(gen: torch.Generator, trial: int) -> tuple[list[Tensor], float]:
    shapes = (((3, 4), (4,), (2, 2)), ((5,), (2, 3), (3,)), ((2, 2, 2), (6,)))[trial % 3]
    scale = (3.0, 0.2, 1.5)[trial % 3]  # trial 1: the norm is below max_norm, nothing is clipped
    grads = [scale * randn(gen, *shape) for shape in shapes]
    grads[0] = 3.0 * grads[0]  # one tensor much larger than the others
    return grads, 2.0


def _flat(grads: list[Tensor]) -> Tensor:
    return torch.cat([g.flatten() for g in grads])


@exercise(
    name="training.clip_by_global_norm",
    prompt=(
        "grads is a list of gradient tensors (one per parameter, different shapes) and max_norm a "
        "float. Clip them by their global norm: ||g|| = sqrt(sum of every squared entry of every "
        "tensor); multiply every tensor by min(1, max_norm / ||g||). Return the clipped gradients "
        "as one vector, torch.cat([g.flatten() for g in clipped]), without changing the inputs."
    ),
    make_inputs=_clip_inputs,
    mistakes=[
        Mistake(
            "you clipped each tensor by its own norm: that changes the direction of the whole "
            "gradient. Use one factor, min(1, max_norm / ||g||), with ||g|| over all tensors together.",
            lambda grads, c: _flat([g * min(1.0, c / g.norm().item()) for g in grads]),
        ),
        Mistake(
            "you rescaled the gradient to norm max_norm even when it was already smaller: clipping "
            "only shrinks, factor min(1, max_norm / ||g||).",
            lambda grads, c: _flat(grads) * c / _flat(grads).norm(),
        ),
        Mistake(
            "the global norm is the square root of the sum of all squared entries, not the sum of the "
            "tensors' norms: ||g|| = sqrt(sum_p ||g_p||^2).",
            lambda grads, c: _flat(grads) * min(1.0, c / sum(g.norm().item() for g in grads)),
        ),
        Mistake(
            "you forgot the square root: ||g||^2 is not the norm.",
            lambda grads, c: _flat(grads) * min(1.0, c / _flat(grads).pow(2).sum().item()),
        ),
    ],
)
def clip_by_global_norm(grads: list[Tensor], max_norm: float) -> Tensor:
    total = torch.sqrt(sum((g**2).sum() for g in grads))  # ||g|| over every tensor
    factor = min(1.0, max_norm / total.item())  # one factor for all of them
    return torch.cat([(g * factor).flatten() for g in grads])


# ---------------------------------------------------------------------------------------------------
# 5. The training step, with PyTorch's pieces


def _step_inputs(gen: torch.Generator, trial: int) -> tuple:
    B, D, K, steps = ((12, 4, 3, 4), (16, 5, 4, 5), (10, 6, 5, 3))[trial % 3]
    X = randn(gen, B, D)
    y = torch.randint(0, K, (B,), generator=gen)
    return 0.5 * randn(gen, D, K), X, y, steps, 0.1, 0.05  # W0, X, y, steps, lr, max_norm


def _steps(W0, X, y, steps, lr, max_norm, *, zero_grad=True, clip=True, fresh_optimizer=False):
    W = W0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([W], lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    for _ in range(steps):
        if fresh_optimizer:
            opt = torch.optim.AdamW([W], lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
        if zero_grad:
            opt.zero_grad()
        F.cross_entropy(X @ W, y).backward()
        if clip:
            torch.nn.utils.clip_grad_norm_([W], max_norm)
        opt.step()
    return W.detach()


@exercise(
    name="training.train_steps",
    prompt=(
        "A softmax classifier with weights W (D, K): logits = X @ W for inputs X (B, D) and class "
        "ids y (B,). Starting from W0, run `steps` training steps on the whole batch, each: zero the "
        "gradients, compute the loss F.cross_entropy(X @ W, y), backpropagate, clip the gradient "
        "with torch.nn.utils.clip_grad_norm_ to max_norm, and take a step of ONE "
        "torch.optim.AdamW([W], lr=lr, betas=(0.9, 0.99), weight_decay=0.1) created before the "
        "loop. Return the final W (detached), shape (D, K)."
    ),
    make_inputs=_step_inputs,
    mistakes=[
        Mistake(
            "the gradients were never zeroed: backward() adds to .grad, so each step used the sum of "
            "all gradients so far. Call optimizer.zero_grad() before each backward().",
            lambda *a: _steps(*a, zero_grad=False),
        ),
        Mistake(
            "clipping had no effect: it must come after backward() (when .grad holds this step's "
            "gradient) and before optimizer.step().",
            lambda *a: _steps(*a, clip=False),
        ),
        Mistake(
            "you created the optimizer inside the loop, so AdamW forgot its moments and bias "
            "correction every step (each update was a first update). Create it once, before the loop.",
            lambda *a: _steps(*a, fresh_optimizer=True),
        ),
    ],
)
def train_steps(W0: Tensor, X: Tensor, y: Tensor, steps: int, lr: float, max_norm: float) -> Tensor:
    W = W0.clone().requires_grad_(True)  # a leaf tensor the optimizer updates
    opt = torch.optim.AdamW([W], lr=lr, betas=(0.9, 0.99), weight_decay=0.1)  # once
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(X @ W, y)  # the mean over the batch
        loss.backward()
        torch.nn.utils.clip_grad_norm_([W], max_norm)  # after backward, before the step
        opt.step()
    return W.detach()


# ---------------------------------------------------------------------------------------------------
# 6. Save and resume a run (the loop's checkpoints, tc.checkpoint)


def toy_start(
    W0: Tensor, lr: float, seed: int
) -> tuple[Tensor, torch.optim.AdamW, torch.Generator]:
    """The start of a process that trains the toy classifier: the process's random number generator
    seeded with ``seed``, the weights ``W`` (a leaf copy of ``W0``), ONE AdamW, and the generator
    that draws the batches (seeded with ``seed`` too)."""
    torch.manual_seed(seed)
    W = W0.clone().requires_grad_(True)
    opt = torch.optim.AdamW([W], lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    return W, opt, torch.Generator().manual_seed(seed)


def toy_step(W: Tensor, opt: torch.optim.Optimizer, gen: torch.Generator, X: Tensor, y: Tensor,
             p: float) -> None:  # fmt: skip
    """One training step of the toy classifier: a random half of the rows drawn with ``gen``,
    dropout with probability ``p`` on their inputs (the mask drawn from the process's random number
    generator, as ``nn.Dropout`` does), the mean cross-entropy of ``X @ W``, one AdamW update."""
    rows = torch.randint(0, X.shape[0], (X.shape[0] // 2,), generator=gen)  # the batch
    opt.zero_grad()
    F.cross_entropy(F.dropout(X[rows], p) @ W, y[rows]).backward()
    opt.step()


def _resume_inputs(gen: torch.Generator, trial: int) -> tuple:
    D, K, B, first, total = ((4, 3, 12, 3, 7), (5, 4, 16, 5, 9), (6, 5, 10, 2, 6))[trial % 3]
    X = randn(gen, B, D)
    return (
        0.5 * randn(gen, D, K),
        X,
        torch.randint(0, K, (B,), generator=gen),
        first,
        total,
        0.05,
        0.3,
    )


def _toy_resumed(W0, X, y, first, total, lr, p, *, rng=True, optimizer=True, batches=True,
                 recount=False):  # fmt: skip
    W, opt, gen = toy_start(W0, lr, seed=0)
    for _ in range(first):
        toy_step(W, opt, gen, X, y, p)
    saved = {"W": W.detach().clone(), "opt": opt.state_dict(), "gen": gen.get_state(),
             "rng": torch.get_rng_state()}  # fmt: skip
    blob = io.BytesIO()
    torch.save(saved, blob)
    W, opt, gen = toy_start(W0, lr, seed=1)  # the process died; a new one starts
    saved = torch.load(io.BytesIO(blob.getvalue()))
    with torch.no_grad():
        W.copy_(saved["W"])
    if optimizer:
        opt.load_state_dict(saved["opt"])
    if batches:
        gen.set_state(saved["gen"])
    if rng:
        torch.set_rng_state(saved["rng"])
    for _ in range(total if recount else total - first):
        toy_step(W, opt, gen, X, y, p)
    return W.detach()


class _ForkedRNG(Exercise):
    """An :class:`Exercise` whose answers reseed the process's random number generator: the checker
    runs them inside a forked state, so the lab's own random numbers do not move."""

    def check(self, answer: Any):
        with torch.random.fork_rng(devices=[]):
            return super().check(answer)


def resume(W0: Tensor, X: Tensor, y: Tensor, first: int, total: int, lr: float, p: float) -> Tensor:
    W, opt, gen = toy_start(W0, lr, seed=0)
    for _ in range(first):
        toy_step(W, opt, gen, X, y, p)
    checkpoint = io.BytesIO()  # a file on disk in a real run (tc.checkpoint writes it atomically)
    torch.save({"W": W.detach().clone(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "rng": torch.get_rng_state()}, checkpoint)  # fmt: skip
    W, opt, gen = toy_start(W0, lr, seed=1)  # the process died; a new one starts from scratch
    saved = torch.load(io.BytesIO(checkpoint.getvalue()))
    with torch.no_grad():
        W.copy_(saved["W"])  # the weights
    opt.load_state_dict(saved["opt"])  # AdamW's moments and step count
    gen.set_state(saved["gen"])  # the batches still to come
    torch.set_rng_state(saved["rng"])  # the dropout masks still to come
    for _ in range(total - first):  # only the remaining steps
        toy_step(W, opt, gen, X, y, p)
    return W.detach()


_RESUME = _ForkedRNG(
    name="training.resume",
    prompt=(
        "Train the toy classifier, let the process die, and resume it so that it ends exactly as a run "
        "that never stopped. Use tc.exercises.training.toy_start and toy_step: W, opt, gen = "
        "toy_start(W0, lr, seed=0); run `first` toy_step(W, opt, gen, X, y, p); save a checkpoint "
        "with torch.save into an io.BytesIO; then the restart: W, opt, gen = toy_start(W0, lr, "
        "seed=1) (a new process, other seeds); load the checkpoint, put everything back, and run the "
        "remaining steps up to `total`. Return W.detach(), shape (D, K). The checker compares it with "
        "the run of `total` steps that never stopped, bit for bit."
    ),
    solution=resume,
    make_inputs=_resume_inputs,
    mistakes=[
        Mistake(
            "resuming without the RNG state: after the restart the dropout masks came from the new "
            "process's seed, not from where the old run had got to. Save torch.get_rng_state() and "
            "restore it with torch.set_rng_state().",
            lambda *a: _toy_resumed(*a, rng=False),
        ),
        Mistake(
            "resuming without the optimizer state: a fresh AdamW starts its moments at zero and its "
            "bias correction at step 1, so the first updates after the restart are too large. Save "
            "opt.state_dict() and restore it with opt.load_state_dict().",
            lambda *a: _toy_resumed(*a, optimizer=False),
        ),
        Mistake(
            "resuming without the batch generator's state: after the restart the batches started "
            "again from the first ones. Save gen.get_state() and restore it with gen.set_state().",
            lambda *a: _toy_resumed(*a, batches=False),
        ),
        Mistake(
            "after resuming you ran `total` steps again instead of the remaining total - first: the "
            "step count is part of the state too.",
            lambda *a: _toy_resumed(*a, recount=True),
        ),
    ],
    atol=0.0,
    rtol=0.0,
)


_REGISTRY[_RESUME.name] = _RESUME


# ---------------------------------------------------------------------------------------------------
# 7. Gradient accumulation (book eq. eq-train-accum)


def _accumulate_inputs(gen: torch.Generator, trial: int) -> tuple:
    B, D, K, k, padded = ((8, 3, 4, 2, ()), (12, 4, 3, 3, (2, 3, 6)), (8, 5, 4, 4, (0, 5)))[
        trial % 3
    ]
    X = randn(gen, B, D)
    y = torch.randint(0, K, (B,), generator=gen)
    y[list(padded)] = -100  # padding: not scored (never a whole micro-batch)
    return 0.5 * randn(gen, D, K), X, y, k


def _accumulated(W0, X, y, k, *, weight="share", zero_between=False):
    W = W0.clone().requires_grad_(True)
    n = int((y != -100).sum())
    for Xi, yi in zip(X.chunk(k), y.chunk(k), strict=True):
        if zero_between:
            W.grad = None
        loss = F.cross_entropy(Xi @ W, yi, ignore_index=-100)
        w = {"share": int((yi != -100).sum()) / n, "k": 1 / k, "none": 1.0}[weight]
        (w * loss).backward()
    return W.grad


@exercise(
    name="training.accumulate",
    prompt=(
        "A softmax classifier with weights W0 (D, K), a batch X (B, D) and targets y (B,) in which "
        "padded rows have y = -100 (not scored). Compute the gradient of the whole batch's mean loss "
        "F.cross_entropy(X @ W, y, ignore_index=-100) with respect to W by gradient accumulation: "
        "split the batch into k micro-batches of B // k consecutive rows, and for each call backward() "
        "on its mean loss times its weight, so that the gradients that add up in W.grad are the "
        "whole batch's. Each micro-batch weighs its share of the scored rows, n_i / n. Return W.grad, "
        "shape (D, K)."
    ),
    make_inputs=_accumulate_inputs,
    mistakes=[
        Mistake(
            "accumulating without dividing by the number of micro-batches: backward() adds the k "
            "micro-batches' mean gradients, k times the batch's mean. Weight each micro-batch's loss "
            "by its share of the scored rows, n_i / n (1 / k when every micro-batch scores as many).",
            lambda *a: _accumulated(*a, weight="none"),
        ),
        Mistake(
            "you divided every micro-batch by k: right only when every micro-batch scores as many "
            "rows. With padding, weight micro-batch i by n_i / n, its share of the scored rows.",
            lambda *a: _accumulated(*a, weight="k"),
        ),
        Mistake(
            "the gradient was reset between micro-batches, so only the last one's is left: zero it "
            "once, before the first micro-batch, and let backward() add up the rest.",
            lambda *a: _accumulated(*a, zero_between=True),
        ),
    ],
)
def accumulate(W0: Tensor, X: Tensor, y: Tensor, k: int) -> Tensor:
    W = W0.clone().requires_grad_(True)
    n = int((y != -100).sum())  # |P|: the scored rows of the whole batch
    for X_i, y_i in zip(X.chunk(k), y.chunk(k), strict=True):  # k micro-batches of B // k rows
        n_i = int((y_i != -100).sum())  # |P_i|
        loss_i = F.cross_entropy(X_i @ W, y_i, ignore_index=-100)  # mean over P_i
        (n_i / n * loss_i).backward()  # adds to W.grad, eq. (eq-train-accum)
    return W.grad
