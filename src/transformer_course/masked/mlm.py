"""Masked language modelling: the corruption, the loss on the chosen positions, an encoder-only model.

Chapter: *Masked models* (Devlin et al. 2019, sec. 3.1 and appendix A.1). A masked language model
(MLM) reads a whole sequence in which some tokens were hidden and predicts the hidden ones from both
sides. Three parts:

* the corruption (:func:`corrupt`, drawn by :func:`mask_tokens`): every position is chosen with
  probability ``p``; a chosen token becomes ``[MASK]`` with probability 0.8, a uniformly random token
  with probability 0.1, and stays itself with probability 0.1 (book eq. ``eq-mlm-corrupt``);
* the loss (:func:`mlm_loss`): the cross-entropy on the chosen positions only (book eq.
  ``eq-mlm-loss``); the other positions carry :data:`IGNORE_INDEX` in the targets;
* the model (:class:`MaskedLM`): the course's GPT with non-causal blocks, the same embeddings,
  learned positions, stack class and tied head (:mod:`..language_models`), and its recipe on
  tiny-shakespeare characters (:data:`MLM_CPU_RECIPE`, run by :func:`train_char_mlm` through the
  course's one loop :func:`..train.train`).

Also the two measurements of the chapter (:func:`mlm_scores`, :func:`lm_scores`): how well a masked
model and a causal one predict one character given both sides (a gap) or only the left side (a
continuation). Random draws happen on the CPU from a seeded ``torch.Generator``, so a seed gives the
same corruption on every device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from ..block import PreNormBlock, TransformerStack
from ..data import get_batch, tinyshakespeare_text, train_val_split
from ..language_models import GPT, SHAKESPEARE_CPU, GPTConfig, LMRecipe
from ..runtime import eval_mode, reusable_run
from ..tokens import CharTokenizer
from ..train import History, TrainConfig, train

__all__ = [
    "IGNORE_INDEX",
    "KEEP_FRAC",
    "MASK_FRAC",
    "MLM_CPU_RECIPE",
    "RANDOM_FRAC",
    "MLMRecipe",
    "MLMRun",
    "MaskedLM",
    "corrupt",
    "lm_scores",
    "mask_tokens",
    "mlm_loss",
    "mlm_scores",
    "train_char_mlm",
]

IGNORE_INDEX = -100
"""The target of a position that is not scored (PyTorch's default ``ignore_index``)."""
MASK_FRAC, RANDOM_FRAC = 0.8, 0.1
"""Of the chosen positions: the share replaced by ``[MASK]`` and by a random token (Devlin et al.)."""
KEEP_FRAC = 1.0 - MASK_FRAC - RANDOM_FRAC
"""Of the chosen positions: the share left unchanged (but still scored)."""


# ---------------------------------------------------------------------------------------------------
# The corruption


def _check_ids(ids: Tensor, vocab_size: int, mask_id: int, p: float) -> None:
    if not isinstance(ids, Tensor) or ids.dtype not in (torch.long, torch.int32):
        raise ValueError(
            f"ids must be a tensor of integer token ids, got {getattr(ids, 'dtype', type(ids))}"
        )
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int (the real tokens), got {vocab_size!r}")
    if 0 <= mask_id < vocab_size:
        raise ValueError(
            f"mask_id={mask_id} is a real token (ids 0..{vocab_size - 1}); give [MASK] an id of its "
            f"own, e.g. mask_id={vocab_size}, and build the model with vocab_size + 1 tokens"
        )
    if not 0.0 < p <= 1.0:
        raise ValueError(
            f"p, the probability that a position is chosen, must be in (0, 1], got {p}"
        )
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
        raise ValueError(
            f"token ids must lie in [0, {vocab_size}) (real tokens, no [MASK] yet), got "
            f"{int(ids.min())}..{int(ids.max())}"
        )


def corrupt(
    ids: Tensor,
    u_choose: Tensor,
    u_kind: Tensor,
    random_ids: Tensor,
    mask_id: int,
    p: float = 0.15,
) -> tuple[Tensor, Tensor]:
    r"""The corruption of book eq. (eq-mlm-corrupt) given its random draws, all of ``ids``'s shape:
    position ``n`` is chosen when ``u_choose[n] < p``; a chosen token becomes ``mask_id`` when
    ``u_kind[n] < 0.8``, ``random_ids[n]`` when ``0.8 <= u_kind[n] < 0.9``, and stays itself
    otherwise. Returns ``(corrupted ids, chosen)``, ``chosen`` a bool tensor.

    Implements: eq-mlm-corrupt

    One uniform per position decides *whether* it is chosen and a second one *how* it is replaced,
    so the three kinds of replacement split the chosen positions and never overlap.
    """
    if not (u_choose.shape == u_kind.shape == random_ids.shape == ids.shape):
        raise ValueError(
            f"u_choose, u_kind and random_ids must have the shape of ids {tuple(ids.shape)}, got "
            f"{tuple(u_choose.shape)}, {tuple(u_kind.shape)}, {tuple(random_ids.shape)}"
        )
    chosen = u_choose < p  # c_{i,n} = 1
    to_mask = chosen & (u_kind < MASK_FRAC)  # 80 %: [MASK]
    to_random = chosen & (u_kind >= MASK_FRAC) & (u_kind < MASK_FRAC + RANDOM_FRAC)  # 10 %: random
    out = torch.where(to_mask, torch.full_like(ids, mask_id), ids)
    out = torch.where(to_random, random_ids.to(ids.dtype), out)  # the other 10 % keep their token
    return out, chosen


def mask_tokens(
    ids: Tensor,
    vocab_size: int,
    mask_id: int,
    p: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Corrupt ``ids`` (any shape, ids in ``[0, vocab_size)``) for masked language modelling.

    Draws, on the CPU from ``generator``, the uniforms and random tokens of :func:`corrupt` (random
    tokens are real tokens, never ``[MASK]``) and returns ``(corrupted, targets, chosen)``:
    ``corrupted`` the model's input, ``targets`` the original token at each chosen position and
    :data:`IGNORE_INDEX` elsewhere, ``chosen`` the bool mask of chosen positions; all on ``ids``'s
    device.

    Implements: eq-mlm-corrupt

    Raises:
        ValueError: ``ids`` not integer or out of range, ``mask_id`` a real token, ``p`` outside
            ``(0, 1]``.
    """
    _check_ids(ids, vocab_size, mask_id, p)
    shape = ids.shape
    u_choose = torch.rand(shape, generator=generator)
    u_kind = torch.rand(shape, generator=generator)
    random_ids = torch.randint(vocab_size, shape, generator=generator)
    dev = ids.device
    corrupted, chosen = corrupt(
        ids, u_choose.to(dev), u_kind.to(dev), random_ids.to(dev), mask_id, p
    )
    targets = torch.where(chosen, ids, torch.full_like(ids, IGNORE_INDEX))
    return corrupted, targets, chosen


# ---------------------------------------------------------------------------------------------------
# The loss


def mlm_loss(logits: Tensor, targets: Tensor, ignore_index: int = IGNORE_INDEX) -> Tensor:
    r"""The masked-LM loss, book eq. (eq-mlm-loss): the mean cross-entropy over the chosen positions
    only, :math:`-\frac{1}{|\mathcal{T}|}\sum_{(i, n) \in \mathcal{T}} \log p_\theta(s_{i,n} \mid
    \tilde{\mathbf{s}}_i, n)`, :math:`\mathcal{T}` the chosen positions and :math:`s_{i,n}` the
    original token, for ``logits`` ``(B, N, V)`` and ``targets`` ``(B, N)`` that hold
    ``ignore_index`` at every position that is not scored (:func:`mask_tokens` makes them).

    Implements: eq-mlm-loss

    Raises:
        ValueError: shapes that do not match, or no position to score (the mean would be 0/0).
    """
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(
            f"need logits (B, N, V) and targets (B, N), got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not (targets != ignore_index).any():
        raise ValueError(
            "no position is chosen (every target is ignore_index): the loss would be 0/0; "
            "use longer sequences, a larger p, or another draw"
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> float32
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=ignore_index)


# ---------------------------------------------------------------------------------------------------
# The model


class MaskedLM(GPT):
    r"""An encoder-only masked language model: :class:`..language_models.GPT` with non-causal blocks.

    Token embedding, learned positions, the pre-norm :class:`..block.TransformerStack`, the final
    LayerNorm, the tied output head and GPT-2's initialisation are the GPT's; only the attention mask
    differs (none: every position reads every other). The stack is rebuilt with ``causal=False`` and
    given the GPT's initial weights, so a seed gives the same initial parameters as a GPT of the same
    config. ``config.vocab_size`` counts the real tokens *and* ``[MASK]``.

    ``forward(idx (B, N), targets (B, N) | None) -> (logits (B, N, V), loss | None)``, the loss that
    of :func:`mlm_loss` (targets :data:`IGNORE_INDEX` where not scored). No cache: a masked model
    re-reads the whole sequence for every prediction.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        c = config
        stack = TransformerStack(
            PreNormBlock, c.n_layers, c.d_model, c.H, activation="gelu", dropout=c.dropout,
            causal=False,
        )  # fmt: skip
        stack.load_state_dict(self.stack.state_dict())  # the GPT's initial weights, no causal mask
        self.stack = stack

    def new_caches(self):
        """A masked model has no key-value cache: it re-reads every position."""
        raise NotImplementedError("a masked language model has no key-value cache")

    def forward(
        self, idx: Tensor, targets: Tensor | None = None, caches: None = None
    ) -> tuple[Tensor, Tensor | None]:
        if caches is not None:
            raise ValueError("a masked language model has no key-value cache; pass caches=None")
        logits = super().forward(idx)[0]  # (B, N, V): embeddings, non-causal stack, head
        if targets is None:
            return logits, None
        return logits, mlm_loss(logits, targets)  # eq. (eq-mlm-loss)


# ---------------------------------------------------------------------------------------------------
# The recipe: a character MLM on tiny-shakespeare


@dataclass(frozen=True)
class MLMRecipe(LMRecipe):
    """How to train a character MLM on tiny-shakespeare: :class:`..language_models.LMRecipe` (same
    split, same validation windows) with the probability ``p`` that a position is chosen. The model's
    ``vocab_size`` is replaced by the characters plus one ``[MASK]`` id."""

    p: float = 0.15


MLM_CPU_RECIPE = MLMRecipe(
    model=SHAKESPEARE_CPU,
    train=TrainConfig(
        max_steps=1000, lr=8e-3, warmup_steps=100, weight_decay=0.1, eval_interval=250,
        time_budget_s=120.0,
    ),
    batch_size=64,
    p=0.15,
)  # fmt: skip
"""The causal GPT's CPU recipe (:data:`..language_models.SHAKESPEARE_CPU_RECIPE`: model, batch,
steps, schedule) with masking at ``p = 0.15``, so that ``bench/mlm.py`` compares the two families on
the same budget of steps and windows. A page trains it for a few hundred steps (``steps=``)."""


@dataclass
class MLMRun:
    """A trained character MLM, its tokenizer, the ``[MASK]`` id and the data it was trained on."""

    model: MaskedLM
    tokenizer: CharTokenizer
    mask_id: int
    history: History
    train_ids: Tensor
    val_ids: Tensor

    @property
    def val_loss(self) -> float:
        """The masked-LM validation loss at the end of training (chosen positions only)."""
        return self.history.evals["val_loss"][-1]


@reusable_run  # the chapter and its lab make the same run: `make test` trains it once
def train_char_mlm(
    recipe: MLMRecipe = MLM_CPU_RECIPE,
    device: torch.device | str = "cpu",
    seed: int = 0,
    steps: int | None = None,
    progress: bool = False,
) -> MLMRun:
    """Train a character MLM on tiny-shakespeare with ``recipe`` (``steps`` shortens it).

    As :func:`..language_models.train_char_lm`: the tokenizer is built from the whole text, the model
    seeded with ``seed``, batches are random windows of the training part; each window is corrupted by
    :func:`mask_tokens` with the loop's seeded generator. The validation loss is :func:`mlm_loss` on
    ``recipe.eval_batches`` fixed windows of the last 10 %, corrupted once with a fixed generator.
    ``[MASK]`` gets the id after the last character.
    """
    recipe = recipe.with_steps(steps)
    torch.manual_seed(seed)
    text = tinyshakespeare_text()
    tok = CharTokenizer.from_text(text)
    train_ids, val_ids = train_val_split(tok.encode_tensor(text))
    V, mask_id = tok.vocab_size, tok.vocab_size
    model = MaskedLM(dataclasses.replace(recipe.model, vocab_size=V + 1)).to(device)
    C, B, p = model.config.block_size, recipe.batch_size, recipe.p
    held_out = torch.Generator().manual_seed(1234)
    val_batches = []
    for _ in range(recipe.eval_batches):
        x = get_batch(val_ids, C, B, held_out)[0]
        corrupted, targets, _ = mask_tokens(x, V, mask_id, p, held_out)
        val_batches.append((corrupted.to(device), targets.to(device)))

    def next_batch(g: torch.Generator) -> tuple[Tensor, Tensor]:
        x = get_batch(train_ids, C, B, g)[0]
        corrupted, targets, _ = mask_tokens(x, V, mask_id, p, g)
        return corrupted.to(device), targets.to(device)

    def loss_fn(m: MaskedLM, batch: tuple[Tensor, Tensor]) -> Tensor:
        return m(*batch)[1]

    def evaluate(m: MaskedLM) -> dict[str, float]:
        return {"val_loss": sum(loss_fn(m, b).item() for b in val_batches) / len(val_batches)}

    history = train(
        model,
        next_batch,
        loss_fn,
        dataclasses.replace(recipe.train, seed=seed),
        evaluate,
        progress=progress,
        scored=lambda batch: int((batch[1] != IGNORE_INDEX).sum()),
    )
    return MLMRun(model, tok, mask_id, history, train_ids, val_ids)


# ---------------------------------------------------------------------------------------------------
# Measuring: a gap or a continuation


def mlm_scores(
    model: MaskedLM, windows: Tensor, position: int, right: int, mask_id: int
) -> tuple[Tensor, Tensor]:
    """Predict the character at ``position`` of each window ``(B, T)`` with the masked model, seeing
    every character to its left and the first ``right`` characters to its right; the character itself
    and everything after those ``right`` are ``[MASK]``. ``right = T - position - 1`` fills a gap
    from both sides; ``right = 0`` continues the left side. Returns the per-window negative
    log-likelihood (nats) ``(B,)`` and whether the arg-max is right ``(B,)``."""
    T = windows.shape[1]
    if not 0 <= position < T or not 0 <= right <= T - position - 1:
        raise ValueError(
            f"need 0 <= position < {T} and 0 <= right <= {T - position - 1}, got position="
            f"{position}, right={right}"
        )
    x = windows.clone()
    x[:, position] = mask_id
    x[:, position + 1 + right :] = mask_id
    with eval_mode(model), torch.no_grad():
        logits = model(x)[0][:, position].float()  # (B, V)
    target = windows[:, position]
    nll = F.cross_entropy(logits, target, reduction="none")
    return nll, logits.argmax(-1) == target


def lm_scores(model: GPT, windows: Tensor, position: int) -> tuple[Tensor, Tensor]:
    """Predict the character at ``position`` of each window ``(B, T)`` with the causal model, from the
    characters before it (it cannot see the right side). Returns the per-window negative
    log-likelihood (nats) ``(B,)`` and whether the arg-max is right ``(B,)``."""
    if not 1 <= position < windows.shape[1]:
        raise ValueError(f"need 1 <= position < {windows.shape[1]}, got {position}")
    with eval_mode(model), torch.no_grad():
        logits = model(windows[:, :position])[0][:, -1].float()  # (B, V)
    target = windows[:, position]
    nll = F.cross_entropy(logits, target, reduction="none")
    return nll, logits.argmax(-1) == target
