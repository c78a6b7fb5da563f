"""Encoder-decoder and vision transformer: masking, padding, cached decoding, shapes, learning."""

from __future__ import annotations

import pytest
import torch

from transformer_course.models import Seq2Seq, Seq2SeqConfig, ViT, ViTConfig
from transformer_course.tasks import FORMATS, DateTask, format_date
from transformer_course.train import TrainConfig, train

TASK = DateTask()


def small_seq2seq(seed=0):
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(
        TASK.vocab_size, TASK.vocab_size, TASK.src_len, TASK.tgt_len, d_model=32, H=2
    )
    return Seq2Seq(cfg).eval()


def test_every_format_round_trips_through_the_vocabulary():
    import datetime as dt

    for style in FORMATS:
        for date in (dt.date(1950, 1, 1), dt.date(2049, 12, 31), dt.date(2000, 9, 27)):
            text = format_date(date, style)
            assert TASK.decode(TASK.encode(text, TASK.src_len)) == text
    with pytest.raises(ValueError, match="unknown date style"):
        format_date(dt.date(2000, 1, 1), "klingon")


def test_decoder_cannot_see_the_future():
    model = small_seq2seq()
    src, tgt = TASK.tensors(TASK.sample(3, seed=1))
    with torch.no_grad():
        logits = model(src, tgt[:, :-1])[0]
        changed = tgt[:, :-1].clone()
        changed[:, 6:] = 5
        other = model(src, changed)[0]
    torch.testing.assert_close(other[:, :6], logits[:, :6])
    assert not torch.allclose(other[:, 6:], logits[:, 6:])


def test_padding_in_the_source_is_invisible():
    model = small_seq2seq()
    src, tgt = TASK.tensors(TASK.sample(4, seed=2))
    noisy = src.clone()
    noisy[src == TASK.PAD] = (
        7  # change only padded positions ... then tell the model they are padding
    )
    with torch.no_grad():
        memory, keep = model.encode(src)
        a = model.decode(tgt[:, :-1], memory, keep)
        memory2, _ = model.encode(noisy)  # its own mask would now treat 7 as a token
    assert not torch.equal(keep, noisy != TASK.PAD)
    # with the original key mask, encoder outputs at real positions ignore the padded keys entirely
    with torch.no_grad():
        H = model.src_pos(model.src_emb(noisy))
        mask = keep[:, None, :].expand(-1, src.shape[1], -1)
        for block in model.encoder:
            H = block(H, mask=mask)
        b = model.decode(tgt[:, :-1], model.encoder_norm(H), keep)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert memory2.shape == memory.shape


def test_cached_decoding_equals_uncached():
    model = small_seq2seq(3)
    src, _ = TASK.tensors(TASK.sample(5, seed=3))
    a = model.greedy_decode(src, TASK.BOS, TASK.EOS, use_cache=True)
    b = model.greedy_decode(src, TASK.BOS, TASK.EOS, use_cache=False)
    assert torch.equal(a, b) and a.shape == (5, TASK.tgt_len)


def test_seq2seq_learns_and_rejects_long_input():
    model = small_seq2seq(4).train()
    src, tgt = TASK.tensors(TASK.sample(512, seed=4))

    def batch(g):
        i = torch.randint(0, 512, (64,), generator=g)
        return src[i], tgt[i]

    def loss_fn(m, b):
        return m(b[0], b[1][:, :-1], b[1][:, 1:])[1]

    before = loss_fn(model, (src[:128], tgt[:128])).item()
    train(model, batch, loss_fn, TrainConfig(max_steps=40, lr=3e-3, warmup_steps=5), progress=False)
    after = loss_fn(model.eval(), (src[:128], tgt[:128])).item()
    assert after < before - 1.0, (before, after)
    with pytest.raises(ValueError, match="at most 30"):
        model.encode(torch.ones(1, 31, dtype=torch.long))


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
