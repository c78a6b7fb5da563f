"""``scratch/gpt.py`` equals the package's GPT (``tc.language_models.GPT``): the package's weights,
random and far from their initialisation, loaded into the scratch model by name (``in_proj`` split
into ``W_q, W_k, W_v``; the other names as the lab's); float64; logits and loss within 1e-12, in
evaluation mode and with dropout; training steps of the scratch loop against ``tc.train.train`` within
1e-10; generation token for token while the sequence fits in the context. Beyond the context the two
generators see different windows (sliding here, jumping in the package) and the test shows it. A
wrong mapping (queries and keys swapped) fails the comparison by far."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.language_models import GPT as PackageGPT
from transformer_course.language_models import GPTConfig, gpt_from_scratch, scratch_names
from transformer_course.scratch import gpt as scratch
from transformer_course.train import TrainConfig

TOL = 1e-12
TRAIN_TOL = 1e-10
# every size different (V, C, L, H, D, d_k), one head of width 6, heads of width 1, a deeper stack
CONFIGS = [
    GPTConfig(vocab_size=13, block_size=10, n_layers=2, H=3, d_model=12, dropout=0.0),
    GPTConfig(vocab_size=9, block_size=7, n_layers=1, H=2, d_model=10, dropout=0.1),
    GPTConfig(vocab_size=5, block_size=4, n_layers=1, H=1, d_model=6, dropout=0.0),
    GPTConfig(vocab_size=17, block_size=16, n_layers=3, H=8, d_model=8, dropout=0.2),
    GPTConfig(vocab_size=11, block_size=12, n_layers=2, H=4, d_model=20, dropout=0.0),
]
IDS = [f"V{c.vocab_size}-C{c.block_size}-L{c.n_layers}-H{c.H}-D{c.d_model}" for c in CONFIGS]


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.double() - b.double()).abs().max().item()


def scratch_state(model: PackageGPT, qkv=("W_q", "W_k", "W_v")) -> dict[str, torch.Tensor]:
    """The package model's weights under the scratch names, by the package's one map
    (``tc.language_models.scratch_state_dict``: the fused ``in_proj`` (3D, D), which stacks
    ``[W_q^T; W_k^T; W_v^T]``, split in three); ``qkv`` renames the three blocks, in order, to plant
    a wrong mapping."""
    state = tc.language_models.scratch_state_dict(model)
    rename = dict(zip(("W_q", "W_k", "W_v"), qkv, strict=True))
    return {
        re.sub(r"\.attn\.(W_[qkv])\.", lambda m: f".attn.{rename[m.group(1)]}.", name): t
        for name, t in state.items()
    }


def package_gpt(config: GPTConfig, seed: int = 0) -> PackageGPT:
    """The package's GPT in float64 and evaluation mode, with random weights far from the
    initialisation: matrices N(0, 1/fan_in), tables N(0, 1), LayerNorm gains 1 + N(0, 0.2^2), every
    bias and LayerNorm shift N(0, 0.2^2), so that no wrong mapping goes unnoticed."""
    torch.manual_seed(seed)
    model = PackageGPT(config).double().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # the tied head is listed once, as tok_emb
            noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "emb" in name:
                p.copy_(noise)
            elif p.dim() == 2:
                p.copy_(noise / math.sqrt(p.shape[1]))
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.2 * noise)
    return model


def both(config: GPTConfig, seed: int = 0) -> tuple[PackageGPT, scratch.GPT]:
    package = package_gpt(config, seed)
    ours = scratch.GPT(config).double().eval()
    ours.load_state_dict(scratch_state(package), strict=True)
    return package, ours


def tokens(config: GPTConfig, B: int, N: int, seed: int) -> torch.Tensor:
    return torch.randint(config.vocab_size, (B, N), generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------------------------------------
# The model: names, logits, loss


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_the_names_and_the_tied_head_are_the_packages(config):
    package, ours = both(config)
    assert ours.lm_head.weight is ours.embed.tok_emb.weight
    assert sum(p.numel() for p in ours.parameters()) == package.num_params()
    assert set(scratch_state(package)) == set(ours.state_dict())


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize(("B", "N"), [(1, 1), (3, 1), (2, 2), (1, 3), (4, "C - 1"), (2, "C")])
def test_logits_and_loss_equal_the_packages(config, B, N):
    N = {"C": config.block_size, "C - 1": config.block_size - 1}.get(N, N)
    package, ours = both(config)
    idx, targets = tokens(config, B, N, 1), tokens(config, B, N, 2)
    with torch.no_grad():
        logits, loss = ours(idx, targets)
        theirs = package(idx)[0]
        assert logits.dtype == torch.float64 and ours(idx)[1] is None
        assert gap(logits, theirs) <= TOL
        assert gap(loss, F.cross_entropy(theirs.flatten(0, 1), targets.flatten())) <= TOL
        # the package's GPT.forward computes its loss in float32 (`logits.float()`), float64 model
        # or not: it agrees only to float32's rounding
        assert gap(loss, package(idx, targets)[1]) <= 1e-6 * loss.item()


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.dropout > 0], ids=lambda c: c.dropout)
def test_with_dropout_the_models_draw_the_same_masks(config):
    """In training mode the scratch model drops what the package's drops, in the same order (the
    embedding sum, each attention's weights, each branch's output), so the same seed gives the same
    logits and gradients."""
    package, ours = both(config)
    package.train(), ours.train()
    idx, targets = tokens(config, 3, config.block_size, 3), tokens(config, 3, config.block_size, 4)
    torch.manual_seed(7)
    theirs, _ = package(idx)
    F.cross_entropy(theirs.flatten(0, 1), targets.flatten()).backward()
    torch.manual_seed(7)
    logits, loss = ours(idx, targets)
    loss.backward()
    torch.manual_seed(8)
    assert gap(logits, theirs) <= TOL
    assert gap(ours(idx)[0], theirs) > 1e-3  # another seed, other masks: dropout is really on
    grads = scratch_state_of_grads(package)
    for name, p in ours.named_parameters():
        assert gap(p.grad, grads[name]) <= TOL, name


def scratch_state_of_grads(model: PackageGPT) -> dict[str, torch.Tensor]:
    """The package model's gradients under the scratch names (``in_proj``'s split in three)."""
    grads = {}
    for name, p in model.named_parameters():
        names = scratch_names(name)
        grads.update(zip(names, p.grad.chunk(len(names)), strict=True))
    return grads


@pytest.mark.parametrize(
    "qkv", [("W_k", "W_q", "W_v"), ("W_q", "W_v", "W_k")], ids=["q-k-swapped", "k-v-swapped"]
)
def test_a_wrong_mapping_fails_by_far(qkv):
    config = CONFIGS[0]
    package = package_gpt(config)
    ours = scratch.GPT(config).double().eval()
    ours.load_state_dict(scratch_state(package, qkv), strict=True)  # the names fit; the meaning not
    idx = tokens(config, 2, config.block_size, 5)
    with torch.no_grad():
        assert gap(ours(idx)[0], package(idx)[0]) > 1e-3


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_gpt_from_scratch_is_the_inverse_map(config):
    """``gpt_from_scratch`` joins W_q, W_k, W_v into the package's ``in_proj``: the package GPT it
    builds from a scratch model computes the scratch model's logits, and mapping its weights back
    gives the scratch model's weights exactly, in the scratch model's dtype, device and mode."""
    _, ours = both(config, seed=3)
    theirs = gpt_from_scratch(ours)
    assert isinstance(theirs, PackageGPT) and not theirs.training
    assert next(theirs.parameters()).dtype == torch.float64
    idx = tokens(config, 2, config.block_size, 7)
    with torch.no_grad():
        assert gap(theirs(idx)[0], ours(idx)[0]) <= TOL
    back = tc.language_models.scratch_state_dict(theirs)
    assert back.keys() == ours.state_dict().keys()
    assert all(torch.equal(back[k], v) for k, v in ours.state_dict().items())
    assert gpt_from_scratch(ours.train()).training


def test_gpt_from_scratch_names_what_does_not_fit():
    config = CONFIGS[0]
    _, ours = both(config)
    del ours.blocks[0].attn.W_k  # a model without the key map
    with pytest.raises(ValueError, match=r"no parameter 'blocks\.0\.attn\.W_k\.weight'"):
        gpt_from_scratch(ours)
    _, ours = both(config)
    ours.final_norm = torch.nn.LayerNorm(config.d_model + 1)
    with pytest.raises(ValueError, match=r"final_norm.weight has shape \(13,\)"):
        gpt_from_scratch(ours)


def test_the_initialisation_is_gpt2s():
    """Built on its own, the scratch model starts as the package's does: N(0, 0.02) matrices and
    tables, N(0, 0.02 / sqrt(2L)) for the projections onto the residual stream (W_o, the MLP's
    second layer), zero biases, LayerNorm gains of one."""
    config = GPTConfig(vocab_size=65, block_size=64, n_layers=2, H=4, d_model=64, dropout=0.0)
    torch.manual_seed(0)
    ours, package = scratch.GPT(config), PackageGPT(config)

    def wanted_std(name: str) -> float:
        residual = name.endswith(("W_o.weight", "mlp.2.weight"))
        return 0.02 / math.sqrt(2 * config.n_layers) if residual else 0.02

    for model, rename in ((ours, str), (package, lambda name: scratch_names(name)[0])):
        for name, p in model.named_parameters():
            if p.dim() == 2:  # thousands of draws: the sample std is within a few per cent
                assert abs(p.std().item() / wanted_std(rename(name)) - 1) < 0.1, name
            else:
                gain = "norm" in name and name.endswith("weight")
                assert torch.all(p == (1.0 if gain else 0.0)), name


# ----------------------------------------------------------------------------------------------
# Training: the scratch loop against tc.train.train

RECIPE = tc.language_models.LMRecipe(  # a short warm-up, strong clipping and decay: all of it acts
    model=GPTConfig(vocab_size=11, block_size=8, n_layers=2, H=2, d_model=16, dropout=0.0),
    train=TrainConfig(
        max_steps=1000, lr=3e-2, warmup_steps=2, weight_decay=0.5, betas=(0.8, 0.95),
        grad_clip=0.3, eval_interval=10**9,
    ),
    batch_size=4,
)  # fmt: skip


def text_ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(40)
    pattern = (torch.arange(400) * 3) % 11  # a periodic text with noise: its loss can fall
    return torch.where(
        torch.rand(400, generator=g) < 0.2, torch.randint(11, (400,), generator=g), pattern
    )


@pytest.mark.parametrize(
    ("dropout", "min_lr", "steps", "seed"),
    [(0.0, None, 6, 0), (0.2, 1e-3, 5, 3), (0.0, None, 1, 1)],
)
def test_training_equals_the_packages_loop(dropout, min_lr, steps, seed):
    recipe = dataclasses.replace(
        RECIPE.with_train(min_lr=min_lr), model=dataclasses.replace(RECIPE.model, dropout=dropout)
    )
    ids, C, B = text_ids(), recipe.model.block_size, recipe.batch_size

    def next_batch(generator):
        return tc.data.get_batch(ids, C, B, generator)

    package, ours = both(recipe.model, seed=1)
    torch.manual_seed(11)  # the dropout masks
    losses = scratch.train(ours, next_batch, recipe, steps, seed)
    torch.manual_seed(11)
    history = tc.train.train(
        package,
        next_batch,
        # the loss in float64 (the package's GPT.forward would round it to float32)
        lambda m, batch: F.cross_entropy(m(batch[0])[0].flatten(0, 1), batch[1].flatten()),
        dataclasses.replace(recipe.with_steps(steps).train, seed=seed),
        progress=False,
    )
    assert len(losses) == steps
    assert history.grad_norm[0] > recipe.train.grad_clip  # the clipping acts
    assert gap(torch.tensor(losses), torch.tensor(history.train_loss)) <= TRAIN_TOL
    trained = scratch_state(package)
    for name, t in ours.state_dict().items():
        assert gap(t, trained[name]) <= TRAIN_TOL, name
    assert gap(ours.embed.tok_emb.weight, package_gpt(recipe.model, 1).tok_emb.weight) > 1e-3


# ----------------------------------------------------------------------------------------------
# Generation


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize(
    "how", [{"greedy": True}, {"temperature": 0.8, "seed": 3}, {"temperature": 2.0, "seed": 9}]
)
def test_generation_equals_the_packages_within_the_context(config, how):
    """While every forward pass sees at most block_size tokens (T0 + new - 1 <= C) the windows agree;
    greedy and seeded sampling choose the same tokens, with and without the package's cache."""
    package, ours = both(config)
    T0 = max(1, config.block_size // 3)
    new = config.block_size - T0 + 1  # the last token is chosen from exactly C tokens
    idx = tokens(config, 2, T0, 6)
    seed = how.pop("seed", 0)
    out = scratch.generate(ours, idx, new, generator=torch.Generator().manual_seed(seed), **how)
    assert out.shape == (2, config.block_size + 1) and torch.equal(out[:, :T0], idx)
    for use_cache in (True, False):
        g = torch.Generator().manual_seed(seed)
        theirs = tc.language_models.generate(
            package, idx, new, use_cache=use_cache, generator=g, **how
        )
        assert torch.equal(out, theirs)


@pytest.mark.parametrize(
    ("weights", "prompt", "how"),
    [(2, 1, {"greedy": True}), (0, 1, {"seed": 1})],
    ids=["greedy", "sampled"],
)
def test_beyond_the_context_the_windows_differ(weights, prompt, how):
    """Past the context, the scratch model slides its window one token at a time (it always sees the
    last C tokens); the package's window jumps by C // 2 (``tc.language_models.window_start``) so that
    its cache is rebuilt once per jump, not at every token, and it sees between C // 2 + 1 and C
    tokens. The two agree up to the last token chosen from at most C tokens; in these seeded cases
    the very next one differs (often they go on agreeing for a while: the same text, other logits)."""
    config = CONFIGS[0]
    C = config.block_size  # 10: the package's window starts at 0, then at 5, 10, ...
    package, ours = both(config, weights)
    idx = tokens(config, 2, 3, prompt)
    seed = how.pop("seed", 0)
    out = scratch.generate(ours, idx, 3 * C, generator=torch.Generator().manual_seed(seed), **how)
    theirs = tc.language_models.generate(
        package, idx, 3 * C, generator=torch.Generator().manual_seed(seed), **how
    )
    assert tc.language_models.window_start(C + 1, C) == C // 2  # 11 tokens: it sees the last 6
    assert torch.equal(out[:, : C + 1], theirs[:, : C + 1])  # each chosen from at most C tokens
    assert not torch.equal(out[:, C + 1], theirs[:, C + 1])  # chosen from 10 tokens here, 6 there
