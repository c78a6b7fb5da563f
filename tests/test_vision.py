"""Chapter *Vision transformers*: the ViT (shapes, errors, learning, overlapping patches and their
initialisation), the recipe and its ablations, the exercises."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.data import random_shift
from transformer_course.exercises import vision as ex_vis
from transformer_course.train import TrainConfig, train
from transformer_course.vision import (
    ABLATIONS,
    DIGITS_RECIPE,
    ViT,
    ViTConfig,
    ablated,
    mixup,
    shifted_probabilities,
    train_digits,
)

# ----------------------------------------------------------------------------------------------
# The model


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_shapes_and_errors(pool):
    torch.manual_seed(0)
    vit = ViT(ViTConfig(pool=pool, n_layers=2, d_model=32))
    assert vit(torch.randn(3, 1, 8, 8)).shape == (3, 10)
    assert vit.tokens(torch.randn(2, 1, 8, 8)).shape == (2, 16 + (pool == "cls"), 32)
    with pytest.raises(ValueError, match=r"images must be \(B, 1, 8, 8\)"):
        vit(torch.randn(3, 1, 16, 16))
    with pytest.raises(ValueError, match="not divisible by patch_size"):
        ViTConfig(image_size=8, patch_size=3)


def test_vit_learns_digits():
    from sklearn.datasets import load_digits

    torch.manual_seed(0)
    digits = load_digits()
    X = torch.tensor(digits.images[:300], dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(digits.target[:300])
    vit = ViT(ViTConfig(n_layers=2, d_model=32, dropout=0.0))

    def loss_fn(m, b):
        return torch.nn.functional.cross_entropy(m(b[0]), b[1])

    before = loss_fn(vit, (X, y)).item()
    train(
        vit,
        lambda g: (X, y),
        loss_fn,
        TrainConfig(max_steps=40, lr=3e-3, warmup_steps=5),
        progress=False,
    )
    assert loss_fn(vit.eval(), (X, y)).item() < before - 0.5


def test_vit_with_overlapping_patches_and_its_patch_initialisation():
    config = ViTConfig(patch_size=4, patch_stride=2, d_model=32, H=2, n_layers=1, pool="mean")
    assert config.n_patches == 16 and config.stride == 2
    assert ViT(config)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)
    for init, std in (("gpt2", 0.02), ("lecun", 0.25)):  # LeCun: 1/sqrt(C P^2) = 1/4 here
        w = ViT(ViTConfig(**{**config.__dict__, "patch_init": init})).patch.proj.weight
        assert abs(w.std().item() - std) < 0.12 * std, (init, w.std().item())
    with pytest.raises(ValueError, match="patch_init"):
        ViTConfig(patch_init="xavier")
    with pytest.raises(ValueError, match="patch_stride=3"):
        ViTConfig(patch_size=4, patch_stride=3)
    with pytest.raises(ValueError, match="at most patch_size"):
        ViTConfig(patch_size=2, patch_stride=4)


# ----------------------------------------------------------------------------------------------
# The recipe


@pytest.mark.parametrize("name", sorted(ABLATIONS))
def test_each_ablation_changes_exactly_its_part(name):
    changed = ablated(DIGITS_RECIPE, name)
    diff = {
        f
        for f in ("smoothing", "mixup_alpha", "augment", "test_shifts", "batch_size", "train")
        if getattr(changed, f) != getattr(DIGITS_RECIPE, f)
    }
    model_diff = {
        k for k, v in changed.model.__dict__.items() if v != getattr(DIGITS_RECIPE.model, k)
    }
    expected = {
        "overlap": (set(), {"patch_size", "patch_stride"}),
        "init": (set(), {"patch_init"}),
        "mixup": ({"mixup_alpha"}, set()),
        "augment": ({"augment"}, set()),
    }[name]
    assert (diff, model_diff) == expected
    with pytest.raises(ValueError, match="unknown ablation"):
        ablated(DIGITS_RECIPE, "dropout")


def test_mixup_blends_images_and_labels_with_one_weight():
    torch.manual_seed(0)
    images, labels = torch.rand(6, 1, 8, 8), torch.arange(6)
    mixed, y_a, y_b, lam = mixup(images, labels, 0.4, torch.Generator().manual_seed(1))
    assert 0 <= lam <= 1 and torch.equal(y_a, labels)
    partner = y_b  # labels are the indices, so y_b names each image's partner
    torch.testing.assert_close(mixed, lam * images + (1 - lam) * images[partner])
    assert mixup(images, labels, 0.0, torch.Generator())[3] == 1.0


def test_test_time_shifts_average_nine_shifted_copies():
    class Probe(
        torch.nn.Module
    ):  # logits = log of the mean brightness of each image's top-left pixel
        def forward(self, x):
            return torch.stack([x[:, 0, 0, 0], torch.zeros(len(x))], dim=1)

    images = torch.zeros(1, 1, 3, 3)
    images[0, 0, 0, 0] = 5.0  # only the unshifted copy and two others keep a value at (0, 0)
    p = shifted_probabilities(Probe(), images)
    logits = [
        images[0, 0, 0, 0] if (dy, dx) in ((1, 1),) else 0.0 for dy in range(3) for dx in range(3)
    ]
    expected = torch.stack([torch.softmax(torch.tensor([float(v), 0.0]), 0) for v in logits]).mean(
        0
    )
    torch.testing.assert_close(p[0], expected)


def test_the_recipe_trains_and_reports_both_accuracies():
    run = train_digits(DIGITS_RECIPE, steps=5)
    assert run.history.steps_done == 5
    assert 0 <= run.test_accuracy <= 1 and 0 <= run.test_accuracy_no_shifts <= 1
    assert run.history.evals["test_accuracy"] == [run.test_accuracy]


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "vision.assemble_vit",
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


def test_position_similarity_is_the_cosine_of_every_pair_of_rows():
    R = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    expected = torch.tensor([[1.0, 0.0, 2**-0.5], [0.0, 1.0, 2**-0.5], [2**-0.5, 2**-0.5, 1.0]])
    torch.testing.assert_close(tc.vision.position_similarity(R), expected)
    with pytest.raises(ValueError, match=r"\(N, D\)"):
        tc.vision.position_similarity(R[None])


def test_mcnemar_counts_the_discordant_items_and_gives_the_exact_two_sided_p():
    a = torch.tensor([True] * 5 + [True, False])
    b = torch.tensor([False] * 5 + [True, False])
    assert tc.vision.mcnemar(a, b) == (2 / 32, 5, 0)  # 2 * P(Bin(5, 1/2) = 0)
    assert tc.vision.mcnemar(b, a) == (2 / 32, 0, 5)
    one_each = torch.tensor([True, False]), torch.tensor([False, True])
    assert tc.vision.mcnemar(*one_each) == (1.0, 1, 1)  # 2 * (1 + 2) / 4 > 1 is capped at 1
    with pytest.raises(ValueError, match="bool tensors"):
        tc.vision.mcnemar(a.float(), b)


# ----------------------------------------------------------------------------------------------
# Label smoothing and the class token's attention (added with the reader's-path rewrite)


def test_smoothed_cross_entropy_equals_torch_and_a_loop():
    from transformer_course.vision import smoothed_cross_entropy

    g = torch.Generator().manual_seed(0)
    z = 3 * torch.randn(6, 10, generator=g, dtype=torch.float64)
    y = torch.randint(0, 10, (6,), generator=g)
    for eps in (0.0, 0.1, 0.5):
        ours = smoothed_cross_entropy(z, y, eps)
        torch_ = F.cross_entropy(z, y, label_smoothing=eps)
        torch.testing.assert_close(ours, torch_, rtol=0, atol=1e-12)
        loop = 0.0
        for b in range(6):
            log_p = z[b] - torch.logsumexp(z[b], 0)
            for k in range(10):
                q = (1 - eps) * int(k == y[b]) + eps / 10
                loop -= q * log_p[k].item() / 6
        assert abs(ours.item() - loop) < 1e-12
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\)"):
        smoothed_cross_entropy(z, y, 1.0)
    with pytest.raises(ValueError, match="targets"):
        smoothed_cross_entropy(z, y[:3], 0.1)


def test_smoothed_targets_have_a_finite_optimum():
    from transformer_course.vision import smoothed_cross_entropy

    eps, K = 0.1, 10
    gap = math.log((1 - eps + eps / K) / (eps / K))  # z_y - z_k at the optimum
    z = torch.zeros(1, K, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        z[0, 3] = gap
    smoothed_cross_entropy(z, torch.tensor([3]), eps).backward()
    assert z.grad.abs().max() < 1e-12


def test_class_token_attention_recomputes_the_weights_of_every_block():
    from transformer_course.vision import class_token_attention

    torch.manual_seed(0)
    vit = ViT(ViTConfig(d_model=16, H=2, n_layers=2, dropout=0.0)).double().eval()
    images = torch.rand(3, 1, 8, 8, dtype=torch.float64)
    a_bar = class_token_attention(vit, images)
    assert a_bar.shape == (3, 2, 16)
    X = vit.tokens(images)
    for ell, block in enumerate(vit.stack.blocks):
        X_norm = block.norm1(X)
        W = block.attn.weights
        b_q, b_k, _ = block.attn.in_proj.bias.detach().split(16)
        Q = (X_norm @ W["W_q"] + b_q).view(3, -1, 2, 8).transpose(1, 2)
        K = (X_norm @ W["W_k"] + b_k).view(3, -1, 2, 8).transpose(1, 2)
        A = torch.softmax(Q @ K.transpose(-2, -1) / 8**0.5, dim=-1)
        torch.testing.assert_close(a_bar[:, ell], A[:, :, 0, 1:].mean(1), rtol=0, atol=1e-12)
        X = block(X)
    with pytest.raises(ValueError, match="class token"):
        class_token_attention(ViT(ViTConfig(pool="mean")), images.float())


# ----------------------------------------------------------------------------------------------
# The assembly exercise (Lab 9, section 5): the learner's ViT, checked with the package's weights


def _vit_case(trial):
    ex = tc.exercises._get("vision.assemble_vit")
    return ex, *ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)


def test_assemble_vit_solution_is_the_package_vit_with_its_weights_by_name():
    for trial in range(3):
        _, images, vit = _vit_case(trial)
        mine = ex_vis.VisionTransformer(vit.config)
        assert dict(mine.named_parameters()).keys() == dict(vit.named_parameters()).keys()
        with torch.no_grad():
            expected = vit(images)
            got = ex_vis._run_vit(ex_vis.VisionTransformer, images, vit)
        torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
        assert expected.std() > 0.3  # seeded weights of order one: logits that tell models apart


def test_assemble_vit_mistakes_differ_from_the_package_and_from_each_other_on_every_trial():
    """Every wrong model is caught on every trial, and no two give the same logits, so the checker's
    first matching mistake is the one the learner made."""
    for trial in range(3):
        ex, images, vit = _vit_case(trial)
        with torch.no_grad():
            expected = vit(images)
        outputs = {m.wrong.__name__: ex_vis._run_vit(m.wrong, images, vit) for m in ex.mistakes}
        assert len(outputs) == len(ex.mistakes) >= 5
        for name, z in outputs.items():
            assert z.shape == expected.shape, name
            assert (z - expected).abs().max() > 5e-2, (trial, name)
        names = list(outputs)
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                assert (outputs[a] - outputs[b]).abs().max() > 5e-2, (trial, a, b)


def test_assemble_vit_checker_names_each_mistake_and_accepts_other_correct_models():
    name = "vision.assemble_vit"
    for mistake in tc.exercises._get(name).mistakes:
        feedback = tc.exercises.check(name, mistake.wrong)
        assert feedback.status == "incorrect" and mistake.why in feedback.message

    class ByHand(ViT):  # the package's parts, the equation written out: also right
        def forward(self, images):
            X = tc.tokens.patchify(images, self.config.patch_size) @ self.patch.proj.weight.T
            X = X + self.patch.proj.bias
            X = torch.cat([self.cls.expand(len(X), 1, -1), X], dim=1) + self.pos.table.weight
            for block in self.stack.blocks:
                X = block(X)
            return self.head(self.stack.final_norm(X)[:, 0])

    assert tc.exercises.check(name, ByHand).status == "correct"
    assert tc.exercises.check(name, ViT).status == "correct"


def test_assemble_vit_checker_explains_what_it_cannot_run():
    name = "vision.assemble_vit"

    class Skeleton(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            raise NotImplementedError

    class OwnNames(ex_vis.VisionTransformer):
        def __init__(self, config):
            super().__init__(config)
            self.class_token = self.cls
            del self.cls

    class TablePerPatch(ex_vis.VisionTransformer):  # N rows: no row for the class token
        def __init__(self, config):
            super().__init__(config)
            self.pos = tc.position.LearnedPositionalEmbedding(config.n_patches, config.d_model)

    class Crashes(ex_vis.VisionTransformer):
        def forward(self, images):
            return self.head(self.patch(images.flatten(1)))  # patches need (B, C, H, W)

    assert tc.exercises.check(name, Skeleton).status == "not attempted"
    assert tc.exercises.check(name, None).status == "not attempted"
    fb = tc.exercises.check(name, OwnNames)
    assert fb.status == "incorrect" and "no parameter `cls`" in fb.message
    assert "`class_token`" in fb.message
    fb = tc.exercises.check(name, TablePerPatch)
    assert fb.status == "incorrect" and "pos.table.weight has shape (16, 8)" in fb.message
    fb = tc.exercises.check(name, Crashes)
    assert fb.status == "error" and "ValueError" in fb.message and "line" in fb.message
    fb = tc.exercises.check(name, ex_vis.VisionTransformer(ViTConfig()))
    assert fb.status == "incorrect" and "pass the class itself" in fb.message


def test_assemble_vit_checker_leaves_the_random_state_alone():
    torch.manual_seed(0)
    tc.exercises.check("vision.assemble_vit", ex_vis.VisionTransformer)
    after = torch.randn(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(3))  # a lab's later cells draw the same numbers
