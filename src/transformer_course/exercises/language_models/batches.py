"""Part 5 of lab 7: batches of windows, ``x`` of ``block_size`` consecutive tokens and ``y`` the same
window one position later. The reference solution is the package's own
:func:`~transformer_course.data.get_batch` (``scratch/gpt.py`` takes its batches from a function, and
the chapter trains it with this one); the checker tests properties of the learner's batches, so any
correct draw passes."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ...data import get_batch
from .. import Mistake
from .checking import CapstoneExercise, Output, _register, _tensor, _Verdict


def _not_shifted(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, x.clone()


def _shifted_back(ids, block_size, batch_size, generator=None):
    starts = 1 + torch.randint(len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s - 1 : s - 1 + block_size] for s in starts])


def _added_one(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, x + 1


def _two_draws(ids, block_size, batch_size, generator=None):
    x, _ = get_batch(ids, block_size, batch_size, generator)
    return x, get_batch(ids, block_size, batch_size, generator)[1]


def _global_rng(ids, block_size, batch_size, generator=None):
    return get_batch(ids, block_size, batch_size, None)


def _one_start(ids, block_size, batch_size, generator=None):
    s = int(torch.randint(len(ids) - block_size, (1,), generator=generator))
    x, y = ids[s : s + block_size], ids[s + 1 : s + block_size + 1]
    return x.expand(batch_size, -1).clone(), y.expand(batch_size, -1).clone()


def _columns(ids, block_size, batch_size, generator=None):
    x, y = get_batch(ids, block_size, batch_size, generator)
    return x.T.contiguous(), y.T.contiguous()


def _never_last(ids, block_size, batch_size, generator=None):
    starts = torch.randint(len(ids) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])


def _past_end(ids, block_size, batch_size, generator=None):
    starts = torch.randint(len(ids) - block_size + 1, (batch_size,), generator=generator)
    x = torch.stack([ids[s : s + block_size] for s in starts])
    return x, torch.stack([ids[s + 1 : s + block_size + 1] for s in starts])


WHY_BATCH_NOT_SHIFTED = (
    "your targets are not shifted: y is the window one position later, y[b, n] = ids[s + n + 1] (the "
    "next token), not x itself."
)
WHY_BATCH_SHIFTED_BACK = (
    "your targets are shifted the wrong way: y[b, n] is the token after x[b, n] (ids[s + n + 1]), not "
    "the one before it."
)
WHY_BATCH_ADDED_ONE = (
    "you added one to the token ids (y = x + 1); the targets are the next tokens of the text, "
    "y = ids[s + 1 : s + block_size + 1]."
)
WHY_BATCH_TWO_DRAWS = (
    "x and y come from different windows: draw the starts once, then take x = ids[s : s + block_size] "
    "and y = ids[s + 1 : s + block_size + 1] from the same start s."
)
WHY_BATCH_IGNORES_GENERATOR = (
    "your batches ignore the generator: the same seed must give the same batch (pass "
    "generator=generator to torch.randint)."
)
WHY_BATCH_ONE_START = (
    "every row of your batch is the same window: draw batch_size starts, one per row, "
    "torch.randint(..., (batch_size,))."
)
WHY_BATCH_TRANSPOSED = (
    "your x and y are (block_size, batch_size); they are (batch_size, block_size), one window "
    "per row."
)
WHY_BATCH_NEVER_LAST = (
    "the last window is never drawn: the starts run from 0 to len(ids) - block_size - 1 inclusive, "
    "torch.randint(len(ids) - block_size, ...) (randint's upper bound is excluded)."
)
WHY_BATCH_PAST_END = (
    "a window ran past the end of ids: y needs one token after x, so the last start is "
    "len(ids) - block_size - 1; draw the starts with torch.randint(len(ids) - block_size, ...)."
)
WHY_BATCH_NOT_WINDOWS = (
    "the rows of x are not windows of ids: row b is ids[s_b : s_b + block_size], consecutive "
    "tokens."
)
BATCH_MISTAKES = [
    Mistake(WHY_BATCH_NOT_SHIFTED, _not_shifted),
    Mistake(WHY_BATCH_SHIFTED_BACK, _shifted_back),
    Mistake(WHY_BATCH_ADDED_ONE, _added_one),
    Mistake(WHY_BATCH_TWO_DRAWS, _two_draws),
    Mistake(WHY_BATCH_IGNORES_GENERATOR, _global_rng),
    Mistake(WHY_BATCH_ONE_START, _one_start),
    Mistake(WHY_BATCH_TRANSPOSED, _columns),
    Mistake(WHY_BATCH_NEVER_LAST, _never_last),
    Mistake(WHY_BATCH_PAST_END, _past_end),
]


def _pair(out: Any) -> tuple[Tensor, Tensor]:
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise _Verdict(f"get_batch must return the pair (x, y), got a {type(out).__name__}.")
    return _tensor(out[0], "get_batch"), _tensor(out[1], "get_batch")


def _observe_batch(answer: Any, case: tuple) -> Output:
    """Properties of the answer's batches; ``{}`` when all hold (any correct draw passes)."""
    n, C, B = case
    # distinct token ids, so that each token says where in ids it was taken from
    ids = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    where = torch.empty(n, dtype=torch.long)
    where[ids] = torch.arange(n)  # where[token] = its position in ids
    x, y = _pair(answer(ids, C, B, torch.Generator().manual_seed(1)))
    if x.shape != (B, C) or y.shape != (B, C):
        if x.shape == (C, B):
            raise _Verdict(WHY_BATCH_TRANSPOSED)
        raise _Verdict(
            f"x and y must both be (batch_size, block_size) = {(B, C)}, got {tuple(x.shape)} and "
            f"{tuple(y.shape)}."
        )
    if x.is_floating_point() or y.is_floating_point():
        raise _Verdict("x and y hold token ids, integers (torch.long), not floats.")
    if torch.equal(y, x + 1):
        raise _Verdict(WHY_BATCH_ADDED_ONE)
    if torch.equal(y, x):
        raise _Verdict(WHY_BATCH_NOT_SHIFTED)
    if not (0 <= min(x.min(), y.min()) and max(x.max(), y.max()) < n):
        raise _Verdict("x and y must hold tokens of ids (take the windows from ids itself).")
    px, py = where[x], where[y]
    if not (px[:, 1:] - px[:, :-1] == 1).all():
        raise _Verdict(WHY_BATCH_NOT_WINDOWS)
    if torch.equal(py, px - 1):
        raise _Verdict(WHY_BATCH_SHIFTED_BACK)
    if not torch.equal(py, px + 1):
        raise _Verdict(WHY_BATCH_TWO_DRAWS)
    again = _pair(answer(ids, C, B, torch.Generator().manual_seed(1)))
    if not (torch.equal(again[0], x) and torch.equal(again[1], y)):
        raise _Verdict(WHY_BATCH_IGNORES_GENERATOR)
    if (px[:, 0] == px[0, 0]).all():
        raise _Verdict(WHY_BATCH_ONE_START)
    short = torch.randperm(C + 3, generator=torch.Generator().manual_seed(2))  # 3 windows fit
    try:
        sx, _ = _pair(answer(short, C, 300, torch.Generator().manual_seed(3)))
    except (IndexError, RuntimeError):
        raise _Verdict(WHY_BATCH_PAST_END) from None
    first = {int((short == t).nonzero()) for t in sx[:, 0]}  # the starts drawn
    if not first <= {0, 1, 2}:
        raise _Verdict(WHY_BATCH_PAST_END)
    if 2 not in first:
        raise _Verdict(WHY_BATCH_NEVER_LAST)
    if first != {0, 1, 2}:
        raise _Verdict(
            f"your windows never start at {sorted({0, 1, 2} - first)}: every start from 0 to "
            "len(ids) - block_size - 1 must be possible."
        )
    return {}


_register(
    CapstoneExercise(
        name="language_models.get_batch",
        prompt=(
            "Write get_batch(ids, block_size, batch_size, generator=None): batch_size windows x of "
            "block_size consecutive tokens of the 1-D tensor ids, each starting at a random position "
            "drawn with the generator, and the same windows shifted by one, y; returns (x, y), each "
            "(batch_size, block_size)."
        ),
        solution=get_batch,
        mistakes=BATCH_MISTAKES,
        cases=lambda: [(1000, 8, 16)],
        observe=_observe_batch,
        describe=lambda case: (
            f"case: len(ids) = {case[0]}, block_size = {case[1]}, batch_size = {case[2]}"
        ),
        kind="function",
        registered_by=__name__,
        passed="every property holds (shapes, shift by one, windows inside ids, every start drawn, "
        "the generator's seed decides)",
    )
)
