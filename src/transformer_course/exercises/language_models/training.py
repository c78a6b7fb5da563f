"""Parts 6 and 7 of lab 7: the training loop, AdamW with weight decay on the matrices, a warm-up and
cosine decay stretched over the steps, gradient clipping. The reference solution is ``scratch/gpt.py``'s
:func:`train` (with its :func:`train_step`, which ``tc.exercises.solution`` prints too); the checker
trains the package's GPT with the learner's loop and with the package's loop, ``tc.train.train``, and
compares the losses step by step and the weights at the end.

Part 7 trains the learner's GPT on tiny-shakespeare with :func:`train_gpt`: the learner's model class,
batches and loop, inline; or, when all three are the reference solutions, the chapter's own run,
:func:`~transformer_course.language_models.train_scratch_gpt`, which ``make test`` trains once for the
chapter and the lab (``tests/test_lab_capstone.py`` proves the inline training with the references the
same computation)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from ... import data
from ...language_models import GPT as PackageGPT
from ...language_models import (
    GPTConfig,
    LMRecipe,
    ScratchRun,
    shakespeare_split,
    train_scratch_gpt,
    validation_loss,
)
from ...scratch import gpt as scratch
from ...scratch.gpt import train, train_step
from ...train import TrainConfig, lr_at
from ...train import train as package_train
from .. import Mistake
from .batches import get_batch
from .checking import CapstoneExercise, Output, _register, _sizes_of, _Verdict


def _wrong_loop(
    zero_grad: bool = True,
    clip: bool = True,
    schedule: bool = True,
    decay_all: bool = False,
    default_betas: bool = False,
    fresh_generator: bool = False,
    step: bool = True,
    stretch: bool = True,
    adam_l2: bool = False,
) -> Callable:
    """A training loop with one typical mistake (the reference when every flag keeps its default)."""

    def loop(model, next_batch, recipe, steps, seed=0):
        cfg = recipe.with_steps(steps).train if stretch else recipe.train
        gen = torch.Generator().manual_seed(seed)
        params = list(model.parameters())
        groups = [
            {
                "params": [p for p in params if decay_all or p.dim() >= 2],
                "weight_decay": cfg.weight_decay,
            },
            {"params": [p for p in params if not decay_all and p.dim() < 2], "weight_decay": 0.0},
        ]
        betas = (0.9, 0.999) if default_betas else cfg.betas
        adam = torch.optim.Adam if adam_l2 else torch.optim.AdamW  # Adam's weight_decay is L2
        optimizer = adam(groups, lr=cfg.lr, betas=betas)
        losses = []
        for s in range(steps):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(s, cfg) if schedule else cfg.lr
            batch = next_batch(torch.Generator().manual_seed(seed) if fresh_generator else gen)
            _, loss = model(*batch)
            if zero_grad:
                optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if step:
                optimizer.step()
            losses.append(loss.item())
        return losses

    return loop


WHY_NO_ZERO_GRAD = (
    "the gradients accumulate from step to step: call optimizer.zero_grad() before loss.backward() at "
    "every step."
)
WHY_NO_CLIP = (
    "the gradients are not clipped: after loss.backward() and before optimizer.step(), clip their "
    "global norm to cfg.grad_clip with torch.nn.utils.clip_grad_norm_."
)
WHY_CONSTANT_LR = (
    "the learning rate never changes: set each step's rate, lr_at(step, cfg) (warm-up, then cosine "
    "decay), in every parameter group before optimizer.step()."
)
WHY_DECAY_ALL = (
    "weight decay acts on every parameter; the recipe decays the matrices only (parameters with "
    "dim >= 2), not the biases and LayerNorm gains (two parameter groups)."
)
WHY_ADAM_L2 = (
    "you used torch.optim.Adam with weight_decay: Adam adds the decay to the gradient (an L2 penalty), "
    "so it is rescaled by Adam's per-parameter step like any gradient. AdamW decays the weights "
    "directly, apart from the gradient (decoupled weight decay): use torch.optim.AdamW with the same "
    "parameter groups."
)
WHY_DEFAULT_BETAS = "your AdamW uses its default betas; use the recipe's, betas=cfg.betas."
WHY_SAME_BATCH = (
    "every step trains on the same batch: create the generator once, before the loop, and pass that "
    "one generator to next_batch at every step."
)
WHY_SCHEDULE_NOT_STRETCHED = (
    "your learning rate follows the recipe's schedule over its own max_steps ({max_steps} in this "
    "check), not over the {steps} steps you train for: after the warm-up it hardly decays. (Part 7 "
    "trains the chapter recipe's own max_steps, 500, where the two coincide; any other STEPS would "
    "not.) Stretch the schedule, cfg = recipe.with_steps(steps).train, and set lr_at(step, cfg) at "
    "every step."
)
WHY_NO_STEP = (
    "the model you were given did not change: train it in place (no copy), calling "
    "optimizer.step() after loss.backward() at every step."
)
# a recipe whose every setting matters within a few steps: a short warm-up, strong clipping and decay
_TRAIN_RECIPE = LMRecipe(
    model=GPTConfig(vocab_size=11, block_size=8, n_layers=1, H=2, d_model=16, dropout=0.0),
    train=TrainConfig(
        max_steps=1000, lr=3e-2, warmup_steps=2, weight_decay=0.5, betas=(0.8, 0.95), grad_clip=0.3,
        eval_interval=10**9,
    ),
    batch_size=4,
)  # fmt: skip
_TRAIN_STEPS = 6  # far fewer than the recipe's max_steps: an unstretched schedule shows


TRAIN_MISTAKES = [
    Mistake(WHY_NO_ZERO_GRAD, _wrong_loop(zero_grad=False)),
    Mistake(WHY_NO_CLIP, _wrong_loop(clip=False)),
    Mistake(WHY_CONSTANT_LR, _wrong_loop(schedule=False)),
    Mistake(WHY_DECAY_ALL, _wrong_loop(decay_all=True)),
    Mistake(WHY_DEFAULT_BETAS, _wrong_loop(default_betas=True)),
    Mistake(WHY_ADAM_L2, _wrong_loop(adam_l2=True)),
    Mistake(WHY_SAME_BATCH, _wrong_loop(fresh_generator=True)),
    Mistake(WHY_NO_STEP, _wrong_loop(step=False)),
    Mistake(
        WHY_SCHEDULE_NOT_STRETCHED.format(
            max_steps=_TRAIN_RECIPE.train.max_steps, steps=_TRAIN_STEPS
        ),
        _wrong_loop(stretch=False),
    ),
]


def _train_case() -> list:
    g = torch.Generator().manual_seed(40)
    pattern = (torch.arange(400) * 3) % 11  # a periodic text with noise: its loss can fall
    noise = torch.randint(11, (400,), generator=g)
    ids = torch.where(torch.rand(400, generator=g) < 0.2, noise, pattern)
    return [(_TRAIN_RECIPE, ids, _TRAIN_STEPS, 0)]


def _fresh_model(recipe: LMRecipe) -> PackageGPT:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return PackageGPT(recipe.model).double()


def _flat(model: nn.Module) -> Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _observe_train(answer: Any, case: tuple) -> Output:
    recipe, ids, steps, seed = case
    model = _fresh_model(recipe)
    before = _flat(model)

    def next_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return get_batch(ids, recipe.model.block_size, recipe.batch_size, generator)

    losses = answer(model, next_batch, recipe, steps, seed)
    try:
        losses = torch.as_tensor([float(v) for v in losses], dtype=torch.float64)
    except (TypeError, ValueError):
        raise _Verdict(
            f"train_loop must return the list of the {steps} training losses (loss.item() at each "
            f"step), got a {type(losses).__name__}."
        ) from None
    if len(losses) != steps:
        raise _Verdict(f"train_loop returned {len(losses)} losses for {steps} steps; one per step.")
    after = _flat(model)
    if torch.equal(before, after):
        raise _Verdict(WHY_NO_STEP)
    return {"the training losses": losses, "the parameters after training": after}


def _expected_train(case: tuple) -> Output:
    recipe, ids, steps, seed = case
    model = _fresh_model(recipe)
    cfg = recipe.with_steps(steps).train
    hist = package_train(
        model,
        lambda g: get_batch(ids, recipe.model.block_size, recipe.batch_size, g),
        lambda m, batch: m(*batch)[1],
        dataclasses.replace(cfg, seed=seed),
        evaluate=None,
        progress=False,
    )
    return {
        "the training losses": torch.tensor(hist.train_loss, dtype=torch.float64),
        "the parameters after training": _flat(model),
    }


def _locate_train(answer: Any, case: tuple) -> str | None:
    got, expected = _observe_train(answer, case), _expected_train(case)
    key = "the training losses"
    if torch.allclose(got[key], expected[key], atol=1e-6, rtol=1e-5):
        return (
            "your losses match the package's loop, but the parameters after training do not: train "
            "the model you were given, in place."
        )
    first = int((~torch.isclose(got[key], expected[key], atol=1e-6, rtol=1e-5)).nonzero()[0])
    return (
        f"your losses follow the package's loop (tc.train.train) until step {first}, then differ "
        f"(you: {got[key][first]:.6g}, expected: {expected[key][first]:.6g}). Compare the learning "
        "rate of each step (lr_at(step, cfg) with the schedule stretched over steps, "
        "cfg = recipe.with_steps(steps).train) and the order of a step: learning rate, batch, loss, "
        "zero_grad, backward, clip, step."
    )


_register(
    CapstoneExercise(
        name="language_models.train_loop",
        prompt=(
            "Write train_loop(model, next_batch, recipe, steps, seed=0): train model in place for steps "
            "steps with the recipe's settings (AdamW with its betas and weight decay on the matrices, "
            "the learning rate lr_at(step, cfg) of the schedule stretched over steps, gradient "
            "clipping), batches from next_batch(generator) with one generator seeded with seed; "
            "return the list of the training losses."
        ),
        solution=train,
        helpers=(train_step,),
        mistakes=TRAIN_MISTAKES,
        cases=_train_case,
        observe=_observe_train,
        expected=_expected_train,
        locate=_locate_train,
        describe=lambda case: (
            f"case: the package's GPT ({_sizes_of(case[0].model)}), {case[2]} steps"
        ),
        kind="function",
        atol=1e-6,
        rtol=1e-5,
        passed="the losses and the trained weights match the package's loop (tc.train.train)",
        registered_by=__name__,
    )
)


def train_gpt(
    GPT: type[nn.Module],
    get_batch: Callable,
    train_loop: Callable,
    recipe: LMRecipe,
    steps: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> ScratchRun:
    """Part 7: train a ``GPT`` (the learner's class) on tiny-shakespeare for ``steps`` steps with the
    learner's ``get_batch`` and ``train_loop`` and the recipe's settings; return the model, its losses,
    the validation loss over the recipe's fixed validation windows and the seconds the steps took.

    The model is built after ``torch.manual_seed(seed)``; the batches are windows of the first 90 % of
    the text, drawn by ``get_batch`` from the generator that ``train_loop`` seeds with ``seed``. When
    all three are the reference solutions (``scratch.gpt.GPT``, :func:`~transformer_course.data.get_batch`
    and ``scratch.gpt.train``), this is the chapter's run, and it is returned as
    :func:`~transformer_course.language_models.train_scratch_gpt` makes it (reused, not trained again,
    where ``make test`` keeps the chapter's runs).
    """
    if GPT is scratch.GPT and get_batch is data.get_batch and train_loop is scratch.train:
        return train_scratch_gpt(recipe, steps, seed, device)  # the same computation, run once
    recipe = recipe.with_steps(steps)
    tok, train_ids, val_ids = shakespeare_split()
    config = dataclasses.replace(recipe.model, vocab_size=tok.vocab_size)
    torch.manual_seed(seed)
    model = GPT(config).to(device)  # nanoGPT's GPT-2-style initialisation, in your GPT.__init__
    C, B = config.block_size, recipe.batch_size

    def next_batch(generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x, y = get_batch(train_ids, C, B, generator)
        return x.to(device), y.to(device)

    start = time.perf_counter()
    losses = [float(v) for v in train_loop(model, next_batch, recipe, steps, seed)]
    seconds = time.perf_counter() - start
    val_loss = validation_loss(model, val_ids, recipe, device, get_batch=get_batch)
    return ScratchRun(model, tok, losses, val_loss, seconds, train_ids, val_ids)
