"""Exercises of the *Masked models* lab: BERT's 80/10/10 corruption given its random draws, and the
masked-LM loss on the chosen positions only.

Chapter: *Masked models* (Devlin et al. 2019, sec. 3.1 and appendix A.1). The random draws are inputs
(``u_choose``, ``u_kind``, ``random_ids``), as in :func:`transformer_course.masked.corrupt`, so an
answer is checked value for value whatever order it would have drawn them in. Token ids are compared
as float64 (the checker subtracts a wrong answer from the reference to report it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from . import Mistake, exercise, randn

V = 10  # real tokens 0..9; [MASK] is 10
MASK_ID = V
SIZES = ((8, 24), (6, 32), (10, 20))


# ---------------------------------------------------------------------------------------------------
# 1. The corruption: choose with probability p, then 80 % [MASK], 10 % random, 10 % unchanged


def _corrupt_inputs(gen: torch.Generator, trial: int) -> tuple:
    B, N = SIZES[trial % 3]
    ids = torch.randint(V, (B, N), generator=gen)
    u_choose = torch.rand(B, N, generator=gen, dtype=torch.float64)
    u_kind = torch.rand(B, N, generator=gen, dtype=torch.float64)
    random_ids = torch.randint(V, (B, N), generator=gen)
    return ids, u_choose, u_kind, random_ids, MASK_ID, 0.3


def _replace(ids, to_mask, to_random, random_ids, mask_id) -> Tensor:
    out = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    return torch.where(to_random, random_ids, out).to(torch.float64)


@exercise(
    name="masked.corrupt",
    prompt=(
        "ids (B, N) holds token ids; u_choose and u_kind are (B, N) uniforms in [0, 1), random_ids "
        "(B, N) random token ids. Position n is chosen when u_choose < p. A chosen token becomes "
        "mask_id when u_kind < 0.8, becomes random_ids[n] when 0.8 <= u_kind < 0.9, and stays itself "
        "otherwise; a position that is not chosen is never changed. Return the corrupted ids (B, N)."
    ),
    make_inputs=_corrupt_inputs,
    mistakes=[
        Mistake(
            "every chosen position became [MASK]: BERT replaces only 80 % of them by [MASK], 10 % by "
            "a random token and leaves 10 % unchanged, so that the model cannot assume that a visible "
            "token is always right (and so that fine-tuning inputs, which have no [MASK], look like "
            "training inputs). Use u_kind to decide how each chosen position is replaced.",
            lambda ids, uc, uk, r, m, p: _replace(
                ids, uc < p, torch.zeros_like(uc, dtype=bool), r, m
            ),
        ),
        Mistake(
            "you chose the [MASK] positions and the random positions with separate draws (u_choose < "
            "0.8 p for [MASK], u_kind < 0.1 p for random): the two sets overlap, the random ones are "
            "not among the chosen positions, and the loss cannot know which positions were changed. "
            "Choose once (u_choose < p), then split the chosen positions with u_kind.",
            lambda ids, uc, uk, r, m, p: _replace(ids, uc < 0.8 * p, uk < 0.1 * p, r, m),
        ),
        Mistake(
            "random tokens were put at positions that were not chosen: the kind draw u_kind applies "
            "only where u_choose < p (combine the conditions with &).",
            lambda ids, uc, uk, r, m, p: _replace(
                ids, (uc < p) & (uk < 0.8), (uk >= 0.8) & (uk < 0.9), r, m
            ),
        ),
        Mistake(
            "no chosen position stays unchanged: you replaced 80 % by [MASK] and the other 20 % by "
            "random tokens; the last 10 % (0.9 <= u_kind) must keep their token.",
            lambda ids, uc, uk, r, m, p: _replace(
                ids, (uc < p) & (uk < 0.8), (uc < p) & (uk >= 0.8), r, m
            ),
        ),
    ],
)
def corrupt(
    ids: Tensor, u_choose: Tensor, u_kind: Tensor, random_ids: Tensor, mask_id: int, p: float
) -> Tensor:
    chosen = u_choose < p  # (B, N): the positions the loss will score
    to_mask = chosen & (u_kind < 0.8)  # 80 % of them: [MASK]
    to_random = chosen & (u_kind >= 0.8) & (u_kind < 0.9)  # 10 %: a random token
    out = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    out = torch.where(to_random, random_ids, out)  # the last 10 % keep their token
    return out.to(torch.float64)  # compared as float64


# ---------------------------------------------------------------------------------------------------
# 2. The loss: cross-entropy on the chosen positions only


def _loss_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor]:
    B, N = SIZES[trial % 3]
    logits = 2.0 * randn(gen, B, N, V + 1)
    ids = torch.randint(V, (B, N), generator=gen)
    chosen = torch.rand(B, N, generator=gen) < 0.15 + 0.5 * torch.rand(B, 1, generator=gen)
    chosen[:, 0] = True  # every sequence has a chosen position; sequences differ in how many
    return logits, ids, chosen


def _ce(logits: Tensor, ids: Tensor) -> Tensor:
    return F.cross_entropy(logits.transpose(1, 2), ids, reduction="none")  # (B, N)


@exercise(
    name="masked.mlm_loss",
    prompt=(
        "logits (B, N, V) are a masked model's outputs for a corrupted batch, ids (B, N) the original "
        "tokens and chosen (B, N) the bool mask of the positions chosen for prediction. Return the "
        "masked-LM loss: the mean over all chosen positions of the batch of -log softmax(logits)[id], "
        "a scalar tensor. Positions that were not chosen must not count at all."
    ),
    make_inputs=_loss_inputs,
    mistakes=[
        Mistake(
            "you scored every position, the visible ones too: copying a visible token is easy and "
            "teaches nothing, and it dilutes the loss of the hidden ones. Score only where chosen is "
            "True (targets = ignore index elsewhere).",
            lambda logits, ids, chosen: _ce(logits, ids).mean(),
        ),
        Mistake(
            "you scored the positions that were NOT chosen: the ignore index must sit at the visible "
            "positions, and the original ids at the chosen ones (torch.where(chosen, ids, -100)).",
            lambda logits, ids, chosen: _ce(logits, ids)[~chosen].mean(),
        ),
        Mistake(
            "you zeroed the losses of the other positions but still divided by all B N positions: an "
            "ignored position must leave the denominator too (the mean is over the chosen positions; "
            "F.cross_entropy with ignore_index does this).",
            lambda logits, ids, chosen: (_ce(logits, ids) * chosen).sum() / chosen.numel(),
        ),
        Mistake(
            "you averaged within each sequence and then over the sequences: a sequence with few chosen "
            "positions then weighs as much as one with many. Average once over all chosen positions.",
            lambda logits, ids, chosen: ((_ce(logits, ids) * chosen).sum(1) / chosen.sum(1)).mean(),
        ),
    ],
)
def mlm_loss(logits: Tensor, ids: Tensor, chosen: Tensor) -> Tensor:
    targets = torch.where(chosen, ids, torch.full_like(ids, -100))  # -100: not scored
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)


# ---------------------------------------------------------------------------------------------------
# The masked auto-encoder's loss (He et al. 2022): hide a share r of the patches, score only those


def _mae_inputs(gen: torch.Generator, trial: int) -> tuple[Tensor, Tensor, Tensor, float]:
    B, N, d, r = ((2, 16, 4, 0.7), (3, 10, 3, 0.65), (1, 9, 2, 0.7))[trial % 3]
    noise = torch.rand(B, N, generator=gen, dtype=torch.float64)  # one uniform number per patch
    return randn(gen, B, N, d), randn(gen, B, N, d), noise, r  # pred, target, noise, r


def _hidden(noise: Tensor, n_keep: int) -> Tensor:
    """``True`` for the patches whose number is not among the ``n_keep`` smallest of their image."""
    ranks = noise.argsort(dim=1).argsort(dim=1)  # rank of each patch's number in its image
    return ranks >= n_keep


def _per_patch(pred: Tensor, target: Tensor) -> Tensor:
    return (
        (pred - target).pow(2).mean(dim=-1)
    )  # (B, N): squared error averaged over a patch's pixels


@exercise(
    name="masked.mae_loss",
    prompt=(
        "pred and target are (B, N, d): predicted and true pixels of each image's N patches; noise "
        "(B, N) holds one uniform number per patch and r is the mask ratio (rho on the page). Each "
        "image keeps the floor((1 - r) N) patches with the smallest numbers and hides the others "
        "(eq. eq-mae-mask). Return the masked auto-encoder's loss (eq. eq-mae-loss): the squared "
        "error averaged over "
        "the d pixels of a patch, then averaged over the hidden patches of all images, a 0-d tensor."
    ),
    make_inputs=_mae_inputs,
    mistakes=[
        Mistake(
            "you scored the visible patches; the loss is over the hidden ones, whose pixels the "
            "encoder never saw (scoring what it saw rewards copying).",
            lambda p, t, noise, r: _per_patch(p, t)[
                ~_hidden(noise, int((1 - r) * noise.shape[1]))
            ].mean(),
        ),
        Mistake(
            "you scored all patches; only the hidden ones count (m_{i,n} = 1), so average over those.",
            lambda p, t, noise, r: _per_patch(p, t).mean(),
        ),
        Mistake(
            "the mask ratio r is the share of patches HIDDEN, not kept: keep floor((1 - r) N), "
            "not floor(r N).",
            lambda p, t, noise, r: _per_patch(p, t)[_hidden(noise, int(r * noise.shape[1]))].mean(),
        ),
        Mistake(
            "you kept the patches with the LARGEST numbers: that is a different but equally valid "
            "uniform mask (the MAE would train as well), but this checker draws the mask by the "
            "prompt's convention, so keep the floor((1 - r) N) patches with the smallest numbers.",
            lambda p, t, noise, r: _per_patch(p, t)[
                _hidden(-noise, int((1 - r) * noise.shape[1]))
            ].mean(),
        ),
        Mistake(
            "you summed the squared errors over a patch's pixels; average them (divide by C P^2).",
            lambda p, t, noise, r: (
                (p - t).pow(2).sum(dim=-1)[_hidden(noise, int((1 - r) * noise.shape[1]))].mean()
            ),
        ),
        Mistake(
            "you rounded (1 - r) N to the nearest whole number; the number of kept patches is its "
            "floor, floor((1 - r) N), as in eq. eq-mae-mask.",
            lambda p, t, noise, r: _per_patch(p, t)[
                _hidden(noise, round((1 - r) * noise.shape[1]))
            ].mean(),
        ),
    ],
)
def mae_loss(pred: Tensor, target: Tensor, noise: Tensor, r: float) -> Tensor:
    N = noise.shape[1]
    n_keep = int((1 - r) * N)  # floor((1 - r) N) visible patches per image
    hidden = noise.argsort(dim=1).argsort(dim=1) >= n_keep  # rank beyond the first n_keep: hidden
    per_patch = (pred - target).pow(2).mean(dim=-1)  # (B, N), mean over the patch's pixels
    return per_patch[hidden].mean()  # mean over every hidden patch of the batch
