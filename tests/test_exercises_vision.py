"""Exercises of the *Vision transformers* lab: each solution passes its checker, each listed mistake is
diagnosed with its own explanation, and the solutions agree with the package's ViT, patchify and
random-shift augmentation."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.data import random_shift
from transformer_course.exercises import vision as ex_vis
from transformer_course.models import ViT, ViTConfig

NAMES = [
    "vision.patch_count",
    "vision.cls_and_positions",
    "vision.mean_pool",
    "vision.shift_images",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("vision.") == sorted(NAMES)


def test_stubs_are_not_attempted():
    def stub(*args):
        raise NotImplementedError

    for name in NAMES:
        assert tc.exercises.check(name, stub).status == "not attempted"


def test_patch_count_accepts_a_tuple_and_matches_patchify():
    assert tc.exercises.check(
        "vision.patch_count", lambda C, h, w, P: ((h // P) * (w // P), C * P * P)
    )
    for C, h, w, P in [(1, 8, 8, 2), (3, 12, 20, 4), (2, 6, 9, 3)]:
        N, d = ex_vis.patch_count(C, h, w, P).tolist()
        assert tc.tokens.patchify(torch.zeros(1, C, h, w), P).shape == (1, N, d)


def _models() -> tuple[ViT, ViT]:
    torch.manual_seed(0)
    cfg = ViTConfig(d_model=16, H=2, n_layers=1, dropout=0.0)
    vit_cls = ViT(cfg).double().eval()
    vit_mean = ViT(ViTConfig(**{**cfg.__dict__, "pool": "mean"})).double().eval()
    with torch.no_grad():  # a non-zero class token, so that leaving it out would show
        vit_cls.cls.normal_()
    return vit_cls, vit_mean


def test_cls_and_positions_is_the_package_vit_input():
    vit, _ = _models()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    X0 = ex_vis.cls_and_positions(vit.patch(images), vit.cls[0, 0], vit.pos.table.weight)
    torch.testing.assert_close(X0, vit.tokens(images), rtol=0, atol=1e-12)


def test_mean_pool_is_the_package_mean_head():
    _, vit = _models()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    X_M = vit.stack(vit.tokens(images))  # (B, N, D), no class token in this model
    with_cls_row = torch.cat([torch.full_like(X_M[:, :1], 7.0), X_M], dim=1)  # (B, 1 + N, D)
    logits = vit.head(ex_vis.mean_pool(with_cls_row))
    torch.testing.assert_close(logits, vit(images), rtol=0, atol=1e-12)


def test_shift_images_moves_content_down_and_right_with_zero_fill():
    x = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    x[0, 0, 1, 3] = 1.0
    out = ex_vis.shift_images(x, torch.tensor([[2, -1]]), 2)
    assert out[0, 0, 3, 2] == 1.0 and out.sum() == 1.0
    edge = torch.ones(1, 1, 4, 4, dtype=torch.float64)
    out = ex_vis.shift_images(edge, torch.tensor([[1, 1]]), 1)
    assert out[0, 0, 0].sum() == 0 and out[0, 0, :, 0].sum() == 0 and out.sum() == 9  # zero fill


def test_shift_images_equals_roll_away_from_the_border_and_round_trips():
    g = torch.Generator().manual_seed(0)
    x = F.pad(torch.rand(6, 2, 4, 5, generator=g, dtype=torch.float64), (2, 2, 2, 2))  # 2 px blank
    shifts = torch.randint(-2, 3, (6, 2), generator=g)
    out = ex_vis.shift_images(x, shifts, 2)
    rolled = torch.stack([torch.roll(x[b], tuple(shifts[b].tolist()), (-2, -1)) for b in range(6)])
    torch.testing.assert_close(out, rolled, rtol=0, atol=0)
    torch.testing.assert_close(out.sum(dim=(1, 2, 3)), x.sum(dim=(1, 2, 3)))  # mass kept
    torch.testing.assert_close(ex_vis.shift_images(out, -shifts, 2), x, rtol=0, atol=0)
    assert torch.equal(ex_vis.shift_images(x, torch.zeros(6, 2, dtype=torch.long), 2), x)


def test_random_shift_has_the_properties_of_a_uniform_shift():
    from transformer_course.data import digits_split

    X = digits_split()[0][:200].repeat(6, 1, 1, 1)  # (1200, 1, 8, 8)
    gen = torch.Generator().manual_seed(0)
    p = 1
    out = random_shift(X, p, gen)
    offsets = [(dy, dx) for dy in range(-p, p + 1) for dx in range(-p, p + 1)]
    candidates = torch.stack(
        [ex_vis.shift_images(X, torch.tensor([o] * len(X)), p) for o in offsets]
    )  # (9, B, 1, 8, 8)
    match = (candidates == out).flatten(2).all(dim=-1)  # (9, B)
    assert match.any(dim=0).all()  # every output is one shift of its input
    freq = torch.bincount(match.float().argmax(dim=0), minlength=len(offsets)) / len(X)
    assert (freq - 1 / len(offsets)).abs().max() < 0.03  # about uniform over the 9 shifts
    assert (out.sum(dim=(1, 2, 3)) <= X.sum(dim=(1, 2, 3)) + 1e-5).all()  # no mass created
    digit = X[:1]
    average = random_shift(digit.repeat(4000, 1, 1, 1), p, gen).mean(dim=0, keepdim=True)
    box = F.conv2d(digit, torch.ones(1, 1, 3, 3) / 9, padding=1)  # all 9 shifts, averaged
    assert (average - box).abs().max() < 0.03
