"""``scratch.vit`` equals the package's ViT (weights loaded by name, float64, eval and training mode),
its block equals ``nn.TransformerEncoderLayer``, its patches equal a loop over the grid, and the
comparison rejects patches flattened in the wrong order."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import transformer_course as tc
from transformer_course.scratch import vit as scratch
from transformer_course.vision import ViTConfig

CONFIGS = [  # image size, patch size, channels, D, heads, layers, classes all vary
    ViTConfig(),  # the package's default: 8 x 8 digits, P = 2, D = 64, 4 heads, 4 layers, dropout 0.1
    ViTConfig(image_size=12, patch_size=3, channels=3, d_model=24, H=3, n_layers=2, n_classes=5),
    ViTConfig(image_size=16, patch_size=4, channels=2, d_model=32, H=8, n_layers=3, n_classes=7),
    ViTConfig(image_size=6, patch_size=6, channels=3, d_model=16, H=1, n_layers=1, n_classes=3),
    ViTConfig(image_size=4, patch_size=1, channels=2, d_model=8, H=2, n_layers=2, n_classes=2),
]
IDS = [
    f"{c.image_size}px-P{c.patch_size}-C{c.channels}-D{c.d_model}-H{c.H}-L{c.n_layers}"
    for c in CONFIGS
]

# package name -> scratch name (anchored patterns, applied in turn); in_proj is split below
RENAMES = [
    (r"^patch\.proj\.", "W_p."),
    (r"^cls$", "x_cls"),
    (r"^pos\.table\.weight$", "R"),
    (r"^stack\.blocks\.", "blocks."),
    (r"\.attn\.out_proj\.", ".attn.W_o."),
    (r"\.mlp\.fc1\.", ".W_1."),
    (r"\.mlp\.fc2\.", ".W_2."),
    (r"^stack\.final_norm\.", "norm."),
    (r"^head\.", "W_head."),
]


def seeded_package_vit(config: ViTConfig, seed: int = 0) -> tc.vision.ViT:
    """The package's ViT in float64 with every parameter random: LayerNorm gains around 1, biases,
    the class token and the positions nonzero, so that no wrong mapping can pass by accident."""
    torch.manual_seed(seed)
    model = tc.vision.ViT(config).double()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if re.search(r"norm\d?\.weight$", name):
                p.add_(1.0)  # a gain gamma near 1
    return model


def to_scratch(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The package's state dict renamed for ``scratch.ViT``; the fused ``in_proj`` (rows
    ``[W_q^T; W_k^T; W_v^T]``) split into ``W_q``, ``W_k`` and ``W_v``."""
    out = {}
    for name, tensor in state.items():
        for pattern, new in RENAMES:
            name = re.sub(pattern, new, name)
        if ".attn.in_proj." in name:
            for W, part in zip(("W_q", "W_k", "W_v"), tensor.chunk(3), strict=True):
                out[name.replace("in_proj", W)] = part
        else:
            out[name] = tensor
    return out


def scratch_from(model: tc.vision.ViT) -> scratch.ViT:
    ours = scratch.ViT(model.config).double()
    ours.load_state_dict(to_scratch(model.state_dict()), strict=True)
    return ours


def images_for(config: ViTConfig, B: int, seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    shape = (B, config.channels, config.image_size, config.image_size)
    return torch.randn(shape, generator=g, dtype=torch.float64)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("B", [1, 3, 5])
def test_scratch_vit_equals_the_package_vit(config, B):
    package = seeded_package_vit(config).eval()
    ours = scratch_from(package).eval()
    images = images_for(config, B)
    with torch.no_grad():
        z = package(images)
        assert z.shape == (B, config.n_classes)
        assert max_diff(ours(images), z) <= 1e-12


def test_the_mapping_covers_every_parameter_once():
    package = seeded_package_vit(CONFIGS[1])
    mapped = to_scratch(package.state_dict())
    assert set(mapped) == set(scratch.ViT(CONFIGS[1]).state_dict())
    n_package = sum(p.numel() for p in package.parameters())
    assert sum(t.numel() for t in mapped.values()) == n_package


@pytest.mark.parametrize("config", CONFIGS[:3], ids=IDS[:3])
def test_scratch_vit_equals_the_package_vit_with_dropout_in_training_mode(config):
    """The package's default ViT has dropout 0.1 (after the positions, on the attention weights and on
    each branch of every block); with the same seed both draw the same masks in the same order. (On
    the CPU, PyTorch's attention kernel drops the attention weights with ``torch.dropout``, as the
    scratch file does; CUDA's fused kernels draw their masks otherwise, so this holds on the CPU.)"""
    assert config.dropout == 0.1
    package = seeded_package_vit(config).train()
    ours = scratch_from(package).train()
    images = images_for(config, 4)
    for seed in (0, 1):
        torch.manual_seed(seed)
        z = package(images)
        torch.manual_seed(seed)
        assert max_diff(ours(images), z) <= 1e-12
    with torch.no_grad():
        assert max_diff(ours.eval()(images), z) > 1e-3  # dropout did act in training mode


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
def test_scratch_block_equals_torch_encoder_layer(config, grad):
    """``nn.TransformerEncoderLayer`` set up as the package's blocks: pre-norm (``norm_first=True``),
    exact GELU, ``d_ff = 4D``, LayerNorm ``eps = 1e-5`` with biases (``nn.LayerNorm``'s default, which
    the scratch block uses), no dropout. Without gradients PyTorch takes its fused fast path."""
    D, H = config.d_model, config.H
    ours = scratch_from(seeded_package_vit(config)).blocks[0].eval()
    theirs = nn.TransformerEncoderLayer(
        D, H, dim_feedforward=4 * D, dropout=0.0, activation="gelu", layer_norm_eps=1e-5,
        batch_first=True, norm_first=True, bias=True, dtype=torch.float64,
    ).eval()  # fmt: skip
    a = ours.attn
    with torch.no_grad():
        theirs.self_attn.in_proj_weight.copy_(torch.cat([a.W_q.weight, a.W_k.weight, a.W_v.weight]))
        theirs.self_attn.in_proj_bias.copy_(torch.cat([a.W_q.bias, a.W_k.bias, a.W_v.bias]))
        pairs = [
            (theirs.self_attn.out_proj, a.W_o),
            (theirs.linear1, ours.W_1),
            (theirs.linear2, ours.W_2),
            (theirs.norm1, ours.norm1),
            (theirs.norm2, ours.norm2),
        ]
        for t, o in pairs:
            t.weight.copy_(o.weight)
            t.bias.copy_(o.bias)
    assert ours.norm1.eps == ours.norm2.eps == theirs.norm1.eps == 1e-5
    g = torch.Generator().manual_seed(3)
    X = torch.randn(4, config.n_patches + 1, D, generator=g, dtype=torch.float64)
    with torch.set_grad_enabled(grad):
        assert max_diff(ours(X), theirs(X)) <= 1e-12


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_scratch_patches_equal_a_loop_over_the_grid(config):
    images = images_for(config, 3)
    P, sides = config.patch_size, config.image_size // config.patch_size
    by_loop = torch.stack(
        [
            images[:, :, i * P : (i + 1) * P, j * P : (j + 1) * P].reshape(
                3, -1
            )  # vec in (C, P, P)
            for i in range(sides)  # rows of patches, top to bottom
            for j in range(sides)  # then left to right along each row
        ],
        dim=1,
    )  # (B, N, C P^2)
    assert torch.equal(scratch.patches(images, P), by_loop)
    assert torch.equal(scratch.patches(images, P), tc.tokens.patchify(images, P))


def reshape_only(images: torch.Tensor, P: int) -> torch.Tensor:
    """The learner's mistake: a reshape without the permute, so a "patch" is a run of consecutive
    pixels of the flattened image (for one channel, P^2 pixels of one pixel row)."""
    B, C, H_px, W_px = images.shape
    return images.reshape(B, (H_px // P) * (W_px // P), C * P * P)


def channels_last(images: torch.Tensor, P: int) -> torch.Tensor:
    """Another order a learner meets (``b c (h p1) (w p2) -> b (h w) (p1 p2 c)``): right patches, but
    each flattened in (P, P, C) order, not the package's (C, P, P)."""
    B, C, H_px, W_px = images.shape
    x = images.reshape(B, C, H_px // P, P, W_px // P, P).permute(0, 2, 4, 3, 5, 1)
    return x.reshape(B, (H_px // P) * (W_px // P), C * P * P)


# The reshape alone is right for a single patch (P = image size) and for one channel with P = 1; the
# (P, P, C) order is right for one channel or P = 1: only configs where a mistake changes the patches
# can show it (a learner who checks on one of the others is not warned).
WRONG = [
    pytest.param(wrong, c, id=f"{wrong.__name__}-{name}")
    for c, name in zip(CONFIGS, IDS, strict=True)
    for wrong, shows in [
        (reshape_only, c.patch_size < c.image_size and (c.channels > 1 or c.patch_size > 1)),
        (channels_last, c.channels > 1 and c.patch_size > 1),
    ]
    if shows
]


@pytest.mark.parametrize(("wrong", "config"), WRONG)
def test_the_comparison_rejects_patches_in_the_wrong_order(wrong, config, monkeypatch):
    package = seeded_package_vit(config).eval()
    ours = scratch_from(package).eval()
    images = images_for(config, 3)
    assert (
        max_diff(wrong(images, config.patch_size), scratch.patches(images, config.patch_size)) > 0
    )
    monkeypatch.setattr(scratch, "patches", wrong)
    with torch.no_grad():
        assert max_diff(ours(images), package(images)) > 1e-3
