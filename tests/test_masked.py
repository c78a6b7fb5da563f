"""Tests of the *Masked models* chapter's masked language model (``masked/mlm.py``) and its exercises."""

from __future__ import annotations

import dataclasses
import importlib
import math

import pytest
import torch
import torch.nn.functional as F

import transformer_course.exercises as ex
from transformer_course.language_models import GPT, TINY
from transformer_course.masked import (
    IGNORE_INDEX,
    KEEP_FRAC,
    MASK_FRAC,
    MLM_CPU_RECIPE,
    RANDOM_FRAC,
    MaskedLM,
    corrupt,
    lm_scores,
    mask_tokens,
    mlm_loss,
    mlm_scores,
    train_char_mlm,
)

V, MASK = 20, 20
CONFIG = dataclasses.replace(TINY, vocab_size=V + 1)

# ----------------------------------------------------------------------------------------------
# The corruption


def _within(count: int, n: int, q: float, sds: float = 5.0) -> bool:
    """``count`` successes of ``n`` Bernoulli(q) draws lie within ``sds`` binomial sds of ``n q``."""
    return abs(count - n * q) <= sds * math.sqrt(n * q * (1 - q))


def test_corruption_statistics_are_80_10_10_of_a_p_share():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(V, (400, 500), generator=gen)  # 200,000 positions
    p = 0.15
    corrupted, targets, chosen = mask_tokens(ids, V, MASK, p, gen)
    n, k = ids.numel(), int(chosen.sum())
    assert _within(k, n, p), (k, n * p)
    masked = chosen & (corrupted == MASK)
    changed = (
        chosen & (corrupted != MASK) & (corrupted != ids)
    )  # a random token unlike the original
    kept = chosen & (corrupted == ids)  # the 10 % kept, and random draws that hit the original
    assert _within(int(masked.sum()), k, MASK_FRAC)
    q_changed = RANDOM_FRAC * (1 - 1 / V)
    assert _within(int(changed.sum()), k, q_changed)
    assert _within(int(kept.sum()), k, KEEP_FRAC + RANDOM_FRAC / V)
    assert int(masked.sum() + changed.sum() + kept.sum()) == k
    assert torch.equal(corrupted[~chosen], ids[~chosen])  # unchosen positions never change
    assert torch.equal(targets[chosen], ids[chosen])
    assert (targets[~chosen] == IGNORE_INDEX).all()
    assert corrupted[chosen & (corrupted != MASK)].max() < V  # random tokens are real, not [MASK]


def test_wrong_fractions_fail_the_statistics_test():
    """The tolerance is tight enough to reject a 75/15/10 split on the same sample size."""
    k = 30_000
    assert not _within(int(0.75 * k), k, MASK_FRAC)
    assert not _within(int(0.15 * k), k, RANDOM_FRAC)


def test_corrupt_splits_the_chosen_positions_by_the_second_draw():
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    u_choose = torch.tensor([[0.1, 0.1, 0.1, 0.9, 0.1]])
    u_kind = torch.tensor([[0.5, 0.85, 0.95, 0.5, 0.79999]])
    random_ids = torch.tensor([[7, 8, 9, 7, 7]])
    out, chosen = corrupt(ids, u_choose, u_kind, random_ids, MASK, 0.15)
    assert out.tolist() == [[MASK, 8, 3, 4, MASK]]
    assert chosen.tolist() == [[True, True, True, False, True]]


def test_mask_tokens_is_seeded_and_keeps_the_device_and_dtype():
    ids = torch.randint(V, (4, 30), generator=torch.Generator().manual_seed(1))
    a = mask_tokens(ids, V, MASK, 0.3, torch.Generator().manual_seed(5))
    b = mask_tokens(ids, V, MASK, 0.3, torch.Generator().manual_seed(5))
    c = mask_tokens(ids, V, MASK, 0.3, torch.Generator().manual_seed(6))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[2], c[2])
    assert a[0].dtype == ids.dtype and a[2].dtype == torch.bool


# ----------------------------------------------------------------------------------------------
# The loss


def test_loss_scores_only_the_chosen_positions(gen):
    logits = torch.randn(3, 9, V + 1, generator=gen, dtype=torch.float64)
    ids = torch.randint(V, (3, 9), generator=gen)
    _, targets, chosen = mask_tokens(ids, V, MASK, 0.4, gen)
    terms = []
    for b in range(3):
        for n in range(9):
            if chosen[b, n]:
                log_z = math.log(sum(math.exp(z) for z in logits[b, n].tolist()))
                terms.append(log_z - logits[b, n, ids[b, n]].item())
    loop = sum(terms) / len(terms)
    got = mlm_loss(logits, targets)
    assert got.dtype == torch.float64
    assert abs(got.item() - loop) < 1e-10
    every = F.cross_entropy(logits.flatten(0, 1), ids.flatten()).item()
    assert abs(every - loop) > 1e-3  # scoring all positions would differ
    logits2 = logits.clone()
    logits2[~chosen] = torch.randn_like(logits2[~chosen])  # visible positions' outputs do not count
    assert mlm_loss(logits2, targets).item() == pytest.approx(got.item(), abs=1e-12)


# ----------------------------------------------------------------------------------------------
# The model


def test_masked_lm_is_not_causal_and_the_gpt_is():
    torch.manual_seed(0)
    mlm, gpt = MaskedLM(CONFIG).eval(), GPT(CONFIG).eval()
    x = torch.randint(V, (1, 12), generator=torch.Generator().manual_seed(2))
    y = x.clone()
    y[0, -1] = (x[0, -1] + 1) % V  # change the last token only
    with torch.no_grad():
        assert (mlm(x)[0][0, 0] - mlm(y)[0][0, 0]).abs().max() > 1e-4  # the first position sees it
        assert torch.equal(gpt(x)[0][0, :-1], gpt(y)[0][0, :-1])  # the GPT's earlier ones do not
    assert not any(blk.attn.causal for blk in mlm.stack.blocks)


def test_masked_lm_starts_from_the_gpt_s_initial_weights():
    torch.manual_seed(3)
    gpt = GPT(CONFIG)
    torch.manual_seed(3)
    mlm = MaskedLM(CONFIG)
    for (na, a), (nb, b) in zip(gpt.state_dict().items(), mlm.state_dict().items(), strict=True):
        assert na == nb and torch.equal(a, b), na
    assert mlm.lm_head.weight is mlm.tok_emb.weight  # tied as in the GPT


def test_forward_loss_is_the_mlm_loss(gen):
    torch.manual_seed(0)
    mlm = MaskedLM(CONFIG).eval()
    ids = torch.randint(V, (2, 16), generator=gen)
    corrupted, targets, _ = mask_tokens(ids, V, MASK, 0.3, gen)
    logits, loss = mlm(corrupted, targets)
    assert loss.item() == pytest.approx(mlm_loss(logits, targets).item(), abs=1e-7)


def test_scores_of_a_gap_and_a_continuation(gen):
    torch.manual_seed(0)
    mlm, gpt = MaskedLM(CONFIG), GPT(CONFIG)
    windows = torch.randint(V, (5, 16), generator=gen)
    for right in (0, 7):
        nll, ok = mlm_scores(mlm, windows, 8, right, MASK)
        assert nll.shape == (5,) and ok.dtype == torch.bool and (nll > 0).all()
    nll, ok = lm_scores(gpt, windows, 8)
    assert nll.shape == (5,)
    with pytest.raises(ValueError, match="right"):
        mlm_scores(mlm, windows, 8, 8, MASK)
    with pytest.raises(ValueError, match="position"):
        lm_scores(gpt, windows, 0)


def test_train_char_mlm_smoke():
    try:
        from transformer_course.data import tinyshakespeare_text

        tinyshakespeare_text()
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    recipe = dataclasses.replace(
        MLM_CPU_RECIPE, model=dataclasses.replace(TINY, block_size=16), batch_size=8, eval_batches=2
    )
    run = train_char_mlm(recipe, steps=3, seed=0)
    assert run.history.steps_done == 3
    assert run.model.config.vocab_size == run.tokenizer.vocab_size + 1 == 66
    assert run.mask_id == 65 and math.isfinite(run.val_loss)
    assert run.val_loss < math.log(66) + 1.0


# ----------------------------------------------------------------------------------------------
# Errors


def test_errors_name_what_is_wrong():
    ids = torch.randint(V, (2, 5))
    with pytest.raises(ValueError, match="real token"):
        mask_tokens(ids, V, 3, 0.15)
    with pytest.raises(ValueError, match="p, the probability"):
        mask_tokens(ids, V, MASK, 0.0)
    with pytest.raises(ValueError, match="integer"):
        mask_tokens(ids.float(), V, MASK, 0.15)
    with pytest.raises(ValueError, match="lie in"):
        mask_tokens(ids + V, V, MASK, 0.15)
    with pytest.raises(ValueError, match="shape"):
        corrupt(ids, torch.rand(2, 4), torch.rand(2, 5), ids, MASK)
    with pytest.raises(ValueError, match="no position is chosen"):
        mlm_loss(torch.randn(2, 5, V), torch.full((2, 5), IGNORE_INDEX))
    with pytest.raises(ValueError, match="logits"):
        mlm_loss(torch.randn(2, 5, V), torch.zeros(2, 4, dtype=torch.long))
    mlm = MaskedLM(CONFIG)
    with pytest.raises(NotImplementedError):
        mlm.new_caches()
    with pytest.raises(ValueError, match="cache"):
        mlm(ids, caches=[])


# ----------------------------------------------------------------------------------------------
# Exercises


def _registered(name: str) -> ex.Exercise:
    importlib.import_module("transformer_course.exercises.masked")  # registers masked.*
    return ex._REGISTRY[name]


@pytest.mark.parametrize("name", ["masked.corrupt", "masked.mlm_loss", "masked.mae_loss"])
def test_exercise_solution_passes_and_each_mistake_is_named(name):
    exercise = _registered(name)
    assert exercise.check(exercise.solution)
    for mistake in exercise.mistakes:
        feedback = exercise.check(mistake.wrong)
        assert not feedback and mistake.why in feedback.message, (mistake.why, feedback)


def test_corrupt_exercise_agrees_with_the_package():
    exercise = _registered("masked.corrupt")
    args = exercise.make_inputs(torch.Generator().manual_seed(0), 0)
    ids, uc, uk, r, m, p = args
    assert torch.equal(exercise.solution(*args), corrupt(ids, uc, uk, r, m, p)[0].double())
