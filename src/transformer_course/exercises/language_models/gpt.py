"""Part 4 of lab 7: the model, embedding, L blocks, final LayerNorm and a head tied to the token table,
started from nanoGPT's GPT-2-style initialisation. The reference solution is ``scratch/gpt.py``'s
:class:`GPT`; the wrong variants below each change one thing, or swap in a wrong part of parts 1-3.
Once the logits and the loss match, the checker builds the learner's model alone and looks at its
initial weights."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...language_models import GPTConfig
from ...scratch.gpt import GPT
from .. import Mistake
from .attention import ATTENTION_MISTAKES
from .block import BLOCK_ONLY_MISTAKES, _locate_block
from .checking import (
    _CONFIGS,
    WHY_TRANSPOSED,
    CapstoneExercise,
    Output,
    _build,
    _close,
    _diagnose,
    _part,
    _register,
    _tensor,
    _variant,
    _Verdict,
    lab_state_dict,
    package_gpt,
)
from .embedding import EMBEDDING_MISTAKES, _Concatenated, _describe_tokens
from .warmups import teacher_forcing_loss


class _GPT(GPT):
    """Wrong models: one attribute per mistake, or a wrong part swapped in (same parameters)."""

    final_norm_used, loss_kind = True, "mean"  # loss_kind: "sum", "softmax", "shifted"
    embedding: type | None = None
    block: type | None = None
    attention: type | None = None

    def __init__(self, config):
        super().__init__(config)
        if self.embedding is not None:
            self.embed.__class__ = self.embedding
        for block in self.blocks:
            if self.block is not None:
                block.__class__ = self.block
            if self.attention is not None:
                block.attn.__class__ = self.attention

    def forward(self, idx, targets=None):
        X = self.drop(self.embed(idx))
        for block in self.blocks:
            X = block(X)
        logits = self.lm_head(self.final_norm(X) if self.final_norm_used else X)
        if targets is None:
            return logits, None
        flat, t = logits.flatten(0, 1), targets.flatten()
        if self.loss_kind == "sum":
            return logits, F.cross_entropy(flat, t, reduction="sum")
        if self.loss_kind == "softmax":
            return logits, F.cross_entropy(torch.softmax(flat, dim=-1), t)
        if self.loss_kind == "shifted":  # targets[:, n + 1] for logits[:, n]: shifted twice
            return logits, F.cross_entropy(logits[:, :-1].flatten(0, 1), targets[:, 1:].flatten())
        return logits, F.cross_entropy(flat, t)


class _Untied(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # not tied


class _TransposedHead(GPT):
    def __init__(self, config):
        super().__init__(config)
        self.lm_head = nn.Linear(config.vocab_size, config.d_model, bias=False)  # weight (D, V)


class _WarmUpLoss(GPT):
    """The warm-up's teacher_forcing_loss, which expects unshifted (B, N + 1) tokens, on targets."""

    def forward(self, idx, targets=None):
        logits, _ = super().forward(idx)
        return logits, None if targets is None else teacher_forcing_loss(logits, targets)


WHY_NO_FINAL_NORM = (
    "your model has no final LayerNorm before the head: in a pre-norm stack the residual stream is "
    "never normalised otherwise, so logits = lm_head(final_norm(X))."
)
WHY_UNTIED = (
    "your head is not tied to the token table: the package's GPT uses W_vocab = E^T (Press & Wolf "
    "2017), so set self.lm_head.weight = self.embed.tok_emb.weight (untied, the model has V x D more "
    "parameters and trains differently)."
)
WHY_LOSS_SUMMED = (
    "your loss is the sum over the B * N predictions; it is their mean (F.cross_entropy's default), "
    "so that the learning rate does not depend on the batch size or the context length."
)
WHY_SOFTMAX_BEFORE_LOSS = (
    "you applied a softmax before F.cross_entropy, which takes logits and applies the log-softmax "
    "itself: pass it the logits."
)
WHY_TARGETS_SHIFTED_AGAIN = (
    "you shifted the targets again: GPT.forward's targets are already the next tokens (the y of "
    "get_batch: targets[b, n] is the token after idx[b, n]), so score logits[:, n] against "
    "targets[:, n]. (The warm-up's teacher_forcing_loss takes the unshifted tokens, (B, N + 1), and "
    "shifts them itself.)"
)
WHY_WARM_UP_LOSS_REUSED = (
    "you passed GPT.forward's targets to the warm-up's teacher_forcing_loss, which takes the unshifted "
    "tokens (B, N + 1) and shifts them itself; the targets (B, N) are already shifted (the y of "
    "get_batch), so the loss is F.cross_entropy(logits.flatten(0, 1), targets.flatten())."
)
WHY_NOT_GPT2_INIT = (
    "your GPT does not start from the GPT-2-style initialisation (nanoGPT's) that the lab trains it "
    "from (part 7): "
    "{what}. End GPT.__init__ as the reference does: every weight matrix and both tables from "
    "N(0, 0.02^2), the projections onto the residual stream (the names ending in W_o.weight and "
    "mlp.2.weight) from N(0, (0.02 / sqrt(2 L))^2), every bias zero."
)
GPT_ONLY_MISTAKES = [
    Mistake(WHY_NO_FINAL_NORM, _variant(_GPT, "_NoFinalNorm", final_norm_used=False)),
    Mistake(WHY_UNTIED, _Untied),
    Mistake(WHY_TRANSPOSED, _TransposedHead),
    Mistake(WHY_LOSS_SUMMED, _variant(_GPT, "_SummedLoss", loss_kind="sum")),
    Mistake(WHY_SOFTMAX_BEFORE_LOSS, _variant(_GPT, "_SoftmaxLoss", loss_kind="softmax")),
    Mistake(WHY_TARGETS_SHIFTED_AGAIN, _variant(_GPT, "_ShiftedTwice", loss_kind="shifted")),
    Mistake(WHY_WARM_UP_LOSS_REUSED, _WarmUpLoss, "raises"),
]
GPT_MISTAKES = (
    GPT_ONLY_MISTAKES
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, embedding=m.wrong), m.fails_by)
        for m in EMBEDDING_MISTAKES
        if m.wrong is not _Concatenated  # (B, N, 2D) breaks the blocks
    ]
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, block=m.wrong))
        for m in BLOCK_ONLY_MISTAKES
    ]
    + [
        Mistake(m.why, _variant(_GPT, "_GPTWith" + m.wrong.__name__, attention=m.wrong), m.fails_by)
        for m in ATTENTION_MISTAKES
    ]
)


def _gpt_cases() -> list:
    cases = []
    for k, config in enumerate(_CONFIGS):
        g = torch.Generator().manual_seed(30 + k)
        idx, targets = torch.randint(config.vocab_size, (2, 2, config.block_size - 1), generator=g)
        cases.append((config, idx, targets))
    return cases


def _logits_and_loss(out: Any) -> tuple[Tensor, Any]:
    if not (isinstance(out, tuple | list) and len(out) == 2):
        raise _Verdict(
            f"GPT.forward must return the pair (logits, loss), got a {type(out).__name__}; return "
            "(logits, None) when no targets are given."
        )
    return _tensor(out[0], "GPT.forward"), out[1]


def _observe_gpt(answer: Any, case: tuple) -> Output:
    config, idx, targets = case
    model = _build(answer, config, lab_state_dict(package_gpt(config)), "GPT")
    if config.tie_weights and model.lm_head.weight is not model.embed.tok_emb.weight:
        raise _Verdict(WHY_UNTIED)
    if getattr(model, "config", None) != config:
        raise _Verdict("keep the configuration as self.config (generation reads model.config).")
    with torch.no_grad():
        logits, loss = _logits_and_loss(model(idx, targets))
    if loss is None:
        raise _Verdict("given targets, GPT.forward must also return the loss, (logits, loss).")
    return {"logits": logits, "loss": _tensor(loss, "GPT.forward").reshape(())}


def _expected_gpt(case: tuple) -> Output:
    config, idx, targets = case
    with torch.no_grad():
        logits = package_gpt(config)(idx)[0]
    return {"logits": logits, "loss": F.cross_entropy(logits.flatten(0, 1), targets.flatten())}


def _locate_gpt(answer: Any, case: tuple) -> str | None:
    """Which part of the learner's GPT departs from the package's: the first that differs."""
    config, idx, targets = case
    theirs, state = package_gpt(config), lab_state_dict(package_gpt(config))
    model = _build(answer, config, state, "GPT")
    with torch.no_grad():
        X = theirs.pos_emb(theirs.tok_emb(idx))
        mine = _tensor(model.embed(idx), "Embedding.forward")
        if not _close(mine, X):
            part = _part(state, "embed.")
            why = _diagnose(
                mine, EMBEDDING_MISTAKES, lambda cls: _build(cls, config, part, "embedding")(idx)
            )
            return (
                why
                or "your embedding (self.embed) differs: check it with language_models.embedding."
            )
        for ell, (block, their_block) in enumerate(
            zip(model.blocks, theirs.stack.blocks, strict=True)
        ):
            Y = their_block(X)
            if not _close(_tensor(block(X), "Block.forward"), Y):
                return f"block {ell}: " + _locate_block(
                    block, their_block, X, config, f"blocks.{ell}."
                )
            X = Y
        if not _close(_tensor(model.final_norm(X), "final_norm"), theirs.stack.final_norm(X)):
            return "your final_norm differs from the package's: it is nn.LayerNorm(D)."
        logits = theirs(idx)[0]
        got = _logits_and_loss(model(idx, targets))[0]
    if _close(got, logits):
        return (
            "the logits match but the loss does not: it is the mean cross-entropy over all B * N "
            "positions, F.cross_entropy(logits.flatten(0, 1), targets.flatten())."
        )
    return (
        "each part matches the package's on its own, but the logits do not: look at how forward "
        "connects them (the blocks in order, final_norm, then lm_head)."
    )


# big enough for the standard deviations to be measured within a few per cent
_INIT_CONFIG = GPTConfig(vocab_size=65, block_size=64, n_layers=2, H=4, d_model=64, dropout=0.0)


def _gpt2_init_verdict(answer: Any) -> str | None:
    """What departs from the GPT-2-style initialisation in a model built by ``answer`` (``None``:
    nothing)."""
    config = _INIT_CONFIG
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = answer(config)
    for name, p in model.named_parameters():
        p = p.detach().double()
        if p.dim() >= 2:
            residual = name.endswith(("W_o.weight", "mlp.2.weight"))
            want = 0.02 / math.sqrt(2 * config.n_layers) if residual else 0.02
            std = p.std().item()
            if not 0.8 * want < std < 1.25 * want:
                what = (
                    f"`{name}` has standard deviation {std:.2g}, the initialisation's is {want:.2g}"
                )
                return WHY_NOT_GPT2_INIT.format(what=what)
        elif name.endswith("bias") and "norm" not in name and p.abs().max() > 0:
            return WHY_NOT_GPT2_INIT.format(what=f"`{name}` does not start at zero")
    return None


_register(
    CapstoneExercise(
        name="language_models.gpt",
        prompt=(
            "Write the class GPT(config): embed = Embedding(config), drop = nn.Dropout, blocks = an "
            "nn.ModuleList of config.n_layers Blocks, final_norm = nn.LayerNorm(D), and lm_head = "
            "nn.Linear(D, V, bias=False) tied to the token table, every weight from the GPT-2-style "
            "initialisation; forward(idx, targets=None) returns (logits (B, N, V), loss), the loss "
            "being the mean cross-entropy of the targets, which are already the next tokens."
        ),
        solution=GPT,
        mistakes=GPT_MISTAKES,
        cases=_gpt_cases,
        observe=_observe_gpt,
        expected=_expected_gpt,
        locate=_locate_gpt,
        then=_gpt2_init_verdict,
        describe=_describe_tokens,
        atol=1e-6,
        rtol=1e-6,
        passed="starts from the GPT-2-style initialisation, and its logits and loss match the package's GPT "
        "with the same weights",
        registered_by=__name__,
    )
)
