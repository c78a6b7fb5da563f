"""Masked auto-encoder (tc.masked.mae): the random patch mask, an encoder that reads only the visible
patches, the loss over the hidden patches alone, training, the linear probe and the clear errors."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from transformer_course.masked.mae import (
    MAE,
    MAE_DIGITS_RECIPE,
    MAEConfig,
    fit_linear_probe,
    linear_probe,
    mae_loss,
    patch_targets,
    random_patch_mask,
    train_mae_digits,
)
from transformer_course.tokens import patchify, unpatchify
from transformer_course.vision import ViTConfig

SMALL = MAEConfig(
    encoder=ViTConfig(patch_size=2, d_model=16, H=2, n_layers=1, dropout=0.0, pool="mean"),
    decoder_d_model=8,
    decoder_H=2,
)


@pytest.mark.parametrize("ratio, N, K", [(0.75, 16, 4), (0.5, 16, 8), (0.6, 10, 4), (0.1, 9, 8)])
def test_mask_keeps_exactly_k_patches_per_image(ratio, N, K):
    g = torch.Generator().manual_seed(0)
    keep, mask, restore = random_patch_mask(5, N, ratio, g)
    assert keep.shape == (5, K) and mask.shape == (5, N) and restore.shape == (5, N)
    assert (mask.sum(dim=1) == N - K).all()  # exactly N - K hidden in every image
    for b in range(5):
        assert len(set(keep[b].tolist())) == K  # K distinct patches
        assert not mask[b, keep[b]].any()  # the kept ones are exactly the visible ones
        assert sorted(restore[b].tolist()) == list(range(N))  # a permutation


def test_masks_differ_between_images_and_are_seeded():
    a = random_patch_mask(8, 16, 0.75, torch.Generator().manual_seed(3))
    b = random_patch_mask(8, 16, 0.75, torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert len({tuple(m.tolist()) for m in a.mask}) > 1  # per image, not one mask for the batch


def test_restore_puts_each_token_back_at_its_patch():
    g = torch.Generator().manual_seed(1)
    B, N, D = 3, 16, 5
    keep, _, restore = random_patch_mask(B, N, 0.75, g)
    X = torch.randn(B, N, D, generator=g)
    shuffle = restore.argsort(dim=1)
    shuffled = X.gather(1, shuffle[..., None].expand(-1, -1, D))
    assert torch.equal(shuffled[:, : keep.shape[1]], X.gather(1, keep[..., None].expand(-1, -1, D)))
    back = shuffled.gather(1, restore[..., None].expand(-1, -1, D))
    assert torch.equal(back, X)


def test_decoder_places_kept_tokens_and_mask_tokens_at_their_patches():
    torch.manual_seed(0)
    model = MAE(SMALL).eval()
    images = torch.rand(2, 1, 8, 8)
    pm = model.mask(images, torch.Generator().manual_seed(2))
    captured = {}
    hook = model.decoder.register_forward_pre_hook(lambda m, args: captured.update(Y=args[0]))
    with torch.no_grad():
        model(images, pm)
    hook.remove()
    Y = captured["Y"] - model.decoder_pos  # (B, N, D_dec) before the decoder's positions
    Z = model.to_decoder(model.encode(images, pm.keep))
    for b in range(2):
        for j, n in enumerate(pm.keep[b].tolist()):
            torch.testing.assert_close(Y[b, n], Z[b, j])
        for n in pm.mask[b].nonzero().flatten().tolist():
            torch.testing.assert_close(Y[b, n], model.mask_token[0, 0])


def test_decode_is_the_decoder_over_the_restored_tokens():
    """eq-mae-dec-in and eq-mae-dec: each kept token mapped by W_dec at its patch, x_mask at every
    hidden one, R_dec added, the decoder blocks, then W_pix and b_pix on every output token."""
    torch.manual_seed(0)
    model = MAE(SMALL).double().eval()
    B, N, D, Dd = 3, 16, SMALL.encoder.d_model, SMALL.decoder_d_model
    pm = random_patch_mask(B, N, 0.75, torch.Generator().manual_seed(4))
    Z = torch.randn(B, 4, D, dtype=torch.float64)
    Y = torch.empty(B, N, Dd, dtype=torch.float64)
    for b in range(B):
        for n in range(N):
            Y[b, n] = model.mask_token[0, 0]
        for j, n in enumerate(pm.keep[b].tolist()):
            Y[b, n] = model.to_decoder.weight @ Z[b, j] + model.to_decoder.bias
    with torch.no_grad():
        out = model.decoder(Y + model.decoder_pos)
        expected = torch.stack(
            [
                torch.stack(
                    [model.to_pixels.weight @ out[b, n] + model.to_pixels.bias for n in range(N)]
                )
                for b in range(B)
            ]
        )
        torch.testing.assert_close(model.decode(Z, pm.restore), expected, atol=1e-12, rtol=0)
        unshuffled = torch.cat([model.to_decoder(Z), model.mask_token.expand(B, N - 4, Dd)], 1)
        wrong = model.to_pixels(model.decoder(unshuffled + model.decoder_pos))
        assert (wrong - expected).abs().max() > 1e-3  # the restore step matters


def test_encoder_never_reads_masked_patches():
    torch.manual_seed(0)
    model = MAE(SMALL).eval()
    images = torch.rand(4, 1, 8, 8)
    pm = model.mask(images, torch.Generator().manual_seed(5))
    with torch.no_grad():
        Z = model.encode(images, pm.keep)
        changed = patchify(images, 2).clone()
        changed[pm.mask] = torch.rand(int(pm.mask.sum()), 4) * 10  # every hidden patch redrawn
        other = unpatchify(changed, 2, 8, 1)
        assert not torch.equal(other, images)
        torch.testing.assert_close(model.encode(other, pm.keep), Z, atol=0, rtol=0)
        visible = patchify(images, 2).clone()
        b, n = 0, pm.keep[0, 0].item()
        visible[b, n] += 1.0  # one visible patch changed
        Z2 = model.encode(unpatchify(visible, 2, 8, 1), pm.keep)
        assert (Z2[0] - Z[0]).abs().max() > 1e-3
        torch.testing.assert_close(Z2[1:], Z[1:])


def test_loss_is_the_mean_over_hidden_patches_only():
    g = torch.Generator().manual_seed(0)
    B, N, d = 3, 16, 4
    pred, target = torch.randn(B, N, d, generator=g), torch.randn(B, N, d, generator=g)
    _, mask, _ = random_patch_mask(B, N, 0.75, g)
    terms = []
    for b in range(B):
        for n in range(N):
            if mask[b, n]:
                terms.append(sum((pred[b, n, j] - target[b, n, j]) ** 2 for j in range(d)) / d)
    loop = sum(terms) / len(terms)
    got = mae_loss(pred, target, mask)
    torch.testing.assert_close(got, loop)
    all_patches = (pred - target).pow(2).mean()
    visible_only = (pred - target).pow(2).mean(-1)[~mask].mean()
    assert abs(all_patches - got) > 1e-3 and abs(visible_only - got) > 1e-3


def test_model_loss_ignores_visible_predictions():
    """Changing the prediction at a visible patch cannot change the loss (it is not scored)."""
    g = torch.Generator().manual_seed(0)
    pred, target = torch.randn(2, 16, 4, generator=g), torch.randn(2, 16, 4, generator=g)
    _, mask, _ = random_patch_mask(2, 16, 0.75, g)
    moved = pred.clone()
    moved[~mask] += 5.0
    assert mae_loss(moved, target, mask) == mae_loss(pred, target, mask)


def test_normalised_targets():
    """He et al.'s normalised pixels: each patch minus its mean, over sqrt(unbiased variance + 1e-6)."""
    images = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    t = patch_targets(images, 2, normalize=True)
    p = patchify(images, 2)
    loop = torch.empty_like(p)
    for b in range(2):
        for n in range(16):
            x = p[b, n].tolist()
            mu = sum(x) / len(x)
            var = sum((v - mu) ** 2 for v in x) / (len(x) - 1)  # unbiased, as in He et al.'s code
            loop[b, n] = torch.tensor([(v - mu) / (var + 1e-6) ** 0.5 for v in x], dtype=p.dtype)
    torch.testing.assert_close(t, loop, atol=1e-12, rtol=0)
    var_n = p.var(-1, unbiased=False, keepdim=True)  # divided by C P^2, not C P^2 - 1
    biased = (p - p.mean(-1, keepdim=True)) / (var_n + 1e-6).sqrt()
    assert (t - biased).abs().max() > 1e-2  # 4 pixels a patch: the two variances differ by 4/3
    torch.testing.assert_close(
        t.mean(-1), torch.zeros(2, 16, dtype=torch.float64), atol=1e-12, rtol=0
    )
    torch.testing.assert_close(patch_targets(images, 2), patchify(images, 2))


def test_a_few_steps_reduce_the_loss():
    recipe = dataclasses.replace(MAE_DIGITS_RECIPE, model=SMALL, augment=None).with_train(
        lr=3e-3, warmup_steps=2, eval_interval=1000
    )
    run = train_mae_digits(recipe, seed=0, steps=30)
    loss = run.history.train_loss
    assert len(loss) == 30
    assert sum(loss[-5:]) / 5 < 0.8 * sum(loss[:3]) / 3


def test_linear_probe_fits_separable_features():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3
    centres = torch.randn(3, 5, generator=g) * 5
    f = centres[y] + 0.1 * torch.randn(60, 5, generator=g)
    res = fit_linear_probe(f[:30], y[:30], f[30:], y[30:])
    assert res.test_accuracy == 1.0 and res.train_accuracy == 1.0
    assert res.W.shape == (3, 5)


def test_linear_probe_of_an_encoder_runs():
    torch.manual_seed(0)
    X = torch.rand(20, 1, 8, 8)
    y = torch.arange(20) % 2
    res = linear_probe(MAE(SMALL).encoder, (X[:10], y[:10], X[10:], y[10:]), max_iter=20)
    assert 0.0 <= res.test_accuracy <= 1.0


@pytest.mark.parametrize("ratio", [0.0, 1.0, -0.2, 1.5])
def test_ratio_outside_open_interval_is_rejected(ratio):
    with pytest.raises(ValueError, match="mask_ratio"):
        random_patch_mask(2, 16, ratio)
    with pytest.raises(ValueError, match="mask_ratio"):
        MAEConfig(mask_ratio=ratio)


def test_ratio_that_keeps_no_patch_is_rejected():
    with pytest.raises(ValueError, match="keeps"):
        random_patch_mask(2, 16, 0.95)


def test_image_size_not_divisible_by_patch_is_rejected():
    with pytest.raises(ValueError, match="divisible"):
        MAEConfig(encoder=ViTConfig(image_size=8, patch_size=3, pool="mean"))


def test_overlapping_patches_and_bad_images_are_rejected():
    with pytest.raises(ValueError, match="non-overlapping"):
        MAEConfig(encoder=ViTConfig(patch_size=4, patch_stride=2, pool="mean"))
    model = MAE(SMALL)
    with pytest.raises(ValueError, match="images must be"):
        model.encode(torch.rand(2, 1, 6, 6), torch.zeros(2, 4, dtype=torch.long))


def test_loss_shape_errors():
    with pytest.raises(ValueError, match="pred and target"):
        mae_loss(torch.zeros(2, 16, 4), torch.zeros(2, 16, 3), torch.ones(2, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="hides no patch"):
        mae_loss(torch.zeros(2, 16, 4), torch.zeros(2, 16, 4), torch.zeros(2, 16, dtype=torch.bool))
