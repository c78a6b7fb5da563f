"""The corpus: env override, cache, checksum, offline errors; token windows for teacher forcing."""

from __future__ import annotations

import datetime as dt
import math
import pathlib
import urllib.request

import pytest
import torch

from transformer_course import data
from transformer_course.data import DATE_FORMATS, DateTask, format_date

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"


def test_env_override_missing_file_says_where(monkeypatch, tmp_path):
    monkeypatch.setenv("TRANSFORMER_COURSE_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"does not exist; put the corpus there"):
        data.tinyshakespeare_path()


def test_wrong_file_is_rejected(monkeypatch, tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("not shakespeare")
    monkeypatch.setenv("TRANSFORMER_COURSE_DATA", str(tmp_path))
    with pytest.raises(ValueError, match="is not the tiny-shakespeare corpus"):
        data.tinyshakespeare_path()


def test_offline_without_a_copy_explains(monkeypatch, tmp_path):
    monkeypatch.delenv("TRANSFORMER_COURSE_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))

    def offline(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(
        FileNotFoundError, match=r"Offline\? Copy the file to .*TRANSFORMER_COURSE_DATA"
    ):
        data.tinyshakespeare_path()


@pytest.mark.skipif(
    not (SHARED / "tinyshakespeare" / "input.txt").exists(), reason="no shared corpus"
)
def test_shared_corpus_is_the_real_one(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_COURSE_DATA", str(SHARED))
    text = data.tinyshakespeare_text()
    assert len(text) == 1_115_394
    assert len(set(text)) == 65


def test_batches_are_shifted_windows():
    ids = torch.arange(100)
    x, y = data.get_batch(ids, 8, 4, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    assert torch.equal(y[:, :-1], x[:, 1:])
    assert torch.equal(y[:, -1], x[:, -1] + 1)
    with pytest.raises(ValueError, match="too short"):
        data.get_batch(torch.arange(5), 8, 2)


def test_split():
    tr, va = data.train_val_split(torch.arange(10))
    assert tr.tolist() == list(range(9)) and va.tolist() == [9]
    with pytest.raises(ValueError, match="1-D"):
        data.train_val_split(torch.zeros(2, 2))


def test_random_affine_is_the_identity_without_a_transform_and_resamples_bilinearly():
    X = data.digits_split()[0][:16].double()  # (16, 1, 8, 8)
    torch.testing.assert_close(data.random_affine(X, 0, 0, 0), X, rtol=0, atol=1e-12)
    # a pure translation by (dx, dy) pixels: output pixel (i, j) is the bilinear interpolation of
    # the input at (i + dy, j + dx), zeros outside; the shifts are the ones the generator draws
    out = data.random_affine(X, 0, 0, 1.0, torch.Generator().manual_seed(3))
    u = torch.rand(len(X), 4, generator=torch.Generator().manual_seed(3), dtype=torch.float32)
    shifts = (u[:, 2:] * 2 - 1).double()  # (dx, dy) in pixels

    def pixel(img, r, c):
        return img[r, c] if 0 <= r < 8 and 0 <= c < 8 else 0.0

    for b in (0, 5, 11):
        dx, dy = shifts[b].tolist()
        img = X[b, 0]
        for i in range(8):
            for j in range(8):
                y, x = i + dy, j + dx
                r0, c0 = math.floor(y), math.floor(x)
                fy, fx = y - r0, x - c0
                direct = (
                    (1 - fy) * (1 - fx) * pixel(img, r0, c0)
                    + (1 - fy) * fx * pixel(img, r0, c0 + 1)
                    + fy * (1 - fx) * pixel(img, r0 + 1, c0)
                    + fy * fx * pixel(img, r0 + 1, c0 + 1)
                )
                assert abs(out[b, 0, i, j].item() - float(direct)) < 1e-5
    again = data.random_affine(X, 10, 0.1, 1.0, torch.Generator().manual_seed(3))
    torch.testing.assert_close(
        again, data.random_affine(X, 10, 0.1, 1.0, torch.Generator().manual_seed(3))
    )
    with pytest.raises(ValueError, match=r"\(B, C, H, W\)"):
        data.random_affine(X[0], 10)
    with pytest.raises(ValueError, match="scale"):
        data.random_affine(X, 10, scale=1.5)


TASK = DateTask()


def test_every_format_round_trips_through_the_vocabulary():
    import datetime as dt

    for style in DATE_FORMATS:
        for date in (dt.date(1950, 1, 1), dt.date(2049, 12, 31), dt.date(2000, 9, 27)):
            text = format_date(date, style)
            assert TASK.decode(TASK.encode(text, TASK.src_len)) == text
    with pytest.raises(ValueError, match="unknown date style"):
        format_date(dt.date(2000, 1, 1), "klingon")


def test_held_out_pairs_avoid_the_training_inputs():
    train_pairs = TASK.sample(2000, seed=1)
    test_pairs = TASK.held_out(300, exclude=train_pairs)
    assert len(test_pairs) == 300
    assert not {s for s, _ in test_pairs} & {s for s, _ in train_pairs}
    assert TASK.held_out(300, exclude=train_pairs) == test_pairs  # reproducible


@pytest.mark.parametrize("style", sorted(DATE_FORMATS))
def test_date_fields_find_year_month_and_day_in_every_format(style):
    dates = [dt.date(1969, 7, 20), dt.date(2001, 1, 2), dt.date(1950, 12, 31), dt.date(2049, 5, 5)]
    for date in dates:
        text = format_date(date, style)
        f = data.date_fields(text)
        assert not set(f["year"]) & set(f["month"]) and not set(f["month"]) & set(f["day"])
        for name, pos in f.items():  # each field is one run of neighbouring characters
            assert pos and pos == list(range(pos[0], pos[-1] + 1)), (text, name, pos)
        year, month, day = ("".join(text[i] for i in f[k]) for k in ("year", "month", "day"))
        assert year in (str(date.year), f"{date.year % 100:02d}"), (text, year)
        assert day.isdigit() and int(day) == date.day, (text, day)
        if month.isdigit():
            assert int(month) == date.month, (text, month)
        else:
            full = data.MONTHS[date.month - 1].lower()
            assert len(month) >= 3 and full.startswith(month.lower()), (text, month)


def test_date_fields_reject_a_string_with_missing_numbers():
    with pytest.raises(ValueError, match="expected 3 numbers"):
        data.date_fields("7/20")
