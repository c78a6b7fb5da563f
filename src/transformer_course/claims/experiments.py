"""Claims: the claims."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from ..block import PostNormBlock, PreNormBlock
from .measurements import (
    _attention_figures,
    fc2_gradient_norms,
    loss_by_position,
)
from .model import ClaimsConfig, ClaimsLM, unit_variance_qk_, xavier_linear_
from .positions import AddedPositions, ConcatenatedPositions, NoPositions, SinusoidalPositions
from .recipes import ClaimsRecipe, _held_out, _recipe
from .runs import ClaimResult, Variant, run_variants
from .variants import BatchNormBlock, TiedQKBlock, UnscaledBlock


def separate_vs_tied_qk(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 1 (Turner 2023, footnote 9): separate query and key maps against one tied map.

    Variants ``separate`` (the baseline, :class:`.block.PreNormBlock`) and ``tied``
    (:class:`TiedQKBlock`). Figures: the held-out loss, and at initialisation and after training the
    mean weight a query puts on its own token (``self_weight_*``) with the attention entropy.
    """
    idx = _held_out(_recipe(setting).model.block_size, _recipe(setting), device)[0][0]

    def measure(model, when, cfg):
        return _attention_figures(model, idx, when)

    return run_variants(
        "tied_qk",
        [Variant("separate", lambda c: ClaimsLM(c)), Variant("tied", lambda c: ClaimsLM(c, TiedQKBlock))],
        setting, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def layernorm_vs_batchnorm(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    small_batch: int = 4,
) -> ClaimResult:  # fmt: skip
    """Claim 2 (Turner fig. 5; Shen et al. 2020): LayerNorm against BatchNorm in every pre-norm block
    and the final norm.

    Variants ``layernorm`` (baseline) and ``batchnorm`` (:class:`BatchNormBlock`) at the recipe's
    batch size, and the same two trained on batches of ``small_batch`` windows
    (``layernorm/B{small_batch}``, ``batchnorm/B{small_batch}``), where batch statistics fluctuate
    more: the mechanism Shen et al. blame. The held-out loss is measured in evaluation mode (BatchNorm
    uses its running averages) on the same held-out batches for every arm; ``val_loss_batch_stats`` is
    the same loss with BatchNorm using each held-out batch's own statistics (a copy of the model in
    training mode).
    """
    recipe = _recipe(setting)
    held = _held_out(recipe.model.block_size, recipe, device)

    def measure(model, when, cfg):
        if when != "final":
            return {}
        twin = copy.deepcopy(model).train()  # batch statistics; the copy's running averages move
        with torch.no_grad():
            loss = sum(twin(*b)[1].item() for b in held) / len(held)
        return {"val_loss_batch_stats": loss}

    b = small_batch
    return run_variants(
        "batchnorm",
        [Variant("layernorm", lambda c: ClaimsLM(c)),
         Variant("batchnorm", lambda c: ClaimsLM(c, BatchNormBlock)),
         Variant(f"layernorm/B{b}", lambda c: ClaimsLM(c), batch_size=b),
         Variant(f"batchnorm/B{b}", lambda c: ClaimsLM(c, BatchNormBlock), batch_size=b)],
        setting, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def added_vs_concatenated(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 3 (Turner footnote 19; the lecture notes, ``bishop2024notes``, sec. 2.14.1 and exercise
    9): learned positions added to the tokens, or concatenated with them.

    Variants ``added`` (baseline: width :math:`D`), ``concatenated`` (the same width :math:`D`: tokens
    of :math:`D - d_\\text{pos}` features and positions of :math:`d_\\text{pos}`) and
    ``concatenated_wider`` (tokens of :math:`D` features and :math:`d_\\text{pos}` more for the
    positions, so every later layer is :math:`D + d_\\text{pos}` wide: the notes' "increase in
    computational cost"). Two more arms repeat ``added`` and ``concatenated`` with GPT-2's
    initialisation of the embedding tables (standard deviation 0.02 instead of
    :data:`EMBEDDING_STD`): ``added/gpt2-init`` and ``concatenated/gpt2-init``. Parameters and training
    seconds are recorded with each run.
    """
    wider = _recipe(setting).model.d_model + _recipe(setting).model.d_pos
    return run_variants(
        "concat",
        [
            Variant("added", lambda c: ClaimsLM(c)),
            Variant("concatenated",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos))),
            Variant("concatenated_wider",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos)),
                    config={"d_model": wider}),
            Variant("added/gpt2-init", lambda c: ClaimsLM(c), config={"embedding_std": 0.02}),
            Variant("concatenated/gpt2-init",
                    lambda c: ClaimsLM(c, positions=ConcatenatedPositions(c.context, c.d_pos)),
                    config={"embedding_std": 0.02}),
        ],
        setting, seeds, device, steps, log=log,
    )  # fmt: skip


def pre_vs_post_norm(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    depths: Sequence[int] | None = None,
) -> ClaimResult:  # fmt: skip
    """Claim 4 (the notes' eqs. 20-23; Xiong et al. 2020): pre-norm against post-norm blocks at each of
    the recipe's ``depths``, each with and without learning-rate warm-up (``recipe.depth_seeds``).

    Variants are named ``"{pre|post}/L{depth}/{warmup|no-warmup}"``; the baseline is the first,
    ``pre/L{shallowest}/warmup``. At the deepest depth three more arms start from Xavier weights
    (:func:`xavier_linear_`, the initialisation of Xiong et al.'s analysis) instead of GPT-2's:
    ``post/L{deepest}/xavier/warmup``, ``post/L{deepest}/xavier/no-warmup`` and
    ``pre/L{deepest}/xavier/no-warmup``. Each run also records the gradient norms of every block's
    second MLP matrix at initialisation (``grad_norms_init``, :func:`fc2_gradient_norms`).
    """
    recipe = _recipe(setting)
    depths = tuple(recipe.depths if depths is None else depths)
    seeds = recipe.depth_seeds if seeds is None else seeds
    x, y = _held_out(recipe.model.block_size, recipe, device)[0]

    def measure(model, when, cfg):
        return {"grad_norms_init": fc2_gradient_norms(model, x, y)} if when == "init" else {}

    variants = [
        Variant(f"{name}/L{L}/{'warmup' if warm else 'no-warmup'}",
                lambda c, blk=blk: ClaimsLM(c, blk), config={"n_layers": L}, warmup=warm)
        for L in depths
        for name, blk in (("pre", PreNormBlock), ("post", PostNormBlock))
        for warm in (True, False)
    ]  # fmt: skip
    deepest = max(depths)
    variants += [
        Variant(f"{name}/L{deepest}/xavier/{'warmup' if warm else 'no-warmup'}",
                lambda c, blk=blk: xavier_linear_(ClaimsLM(c, blk)),
                config={"n_layers": deepest}, warmup=warm)
        for name, blk, warm in (("post", PostNormBlock, True), ("post", PostNormBlock, False),
                                ("pre", PreNormBlock, False))
    ]  # fmt: skip
    return run_variants("norm_position", variants, recipe, seeds, device, steps, measure, log=log)


def scaled_vs_unscaled(
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
) -> ClaimResult:  # fmt: skip
    """Claim 5 (the notes, sec. 2.10; MIT 6.390 sec. 9.3.2): attention with and without the
    :math:`1/\\sqrt{d_k}` scale.

    One head (:math:`d_k = D`, the largest the width allows, where the claim bites hardest), with the
    query and key maps initialised so that queries and keys have unit-variance entries
    (:func:`unit_variance_qk_`: the premise of the notes' argument). Variants ``scaled`` (baseline) and
    ``unscaled`` (:class:`UnscaledBlock`). Figures: the held-out loss, and the attention entropy
    (:func:`normalised_entropy`) and mean largest weight at initialisation and after training.
    """
    recipe = _recipe(setting)
    idx = _held_out(recipe.model.block_size, recipe, device)[0][0]

    def measure(model, when, cfg):
        return _attention_figures(model, idx, when)

    return run_variants(
        "scale",
        [Variant("scaled", lambda c: unit_variance_qk_(ClaimsLM(c)), config={"H": 1}),
         Variant("unscaled", lambda c: unit_variance_qk_(ClaimsLM(c, UnscaledBlock)),
                 config={"H": 1})],
        recipe, seeds, device, steps, measure, log=log,
    )  # fmt: skip


def _sinusoidal(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=SinusoidalPositions(c.d_model))


def _learned(c: ClaimsConfig) -> nn.Module:  # rows beyond the training windows are never trained
    return ClaimsLM(c, positions=AddedPositions(c.context, c.d_model))


def _learned_clamp(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=AddedPositions(c.block_size, c.d_model, clamp=True))


def _no_positions(c: ClaimsConfig) -> nn.Module:
    return ClaimsLM(c, positions=NoPositions())


POSITION_SCHEMES: dict[str, Callable[[ClaimsConfig], nn.Module]] = {
    "sinusoidal": _sinusoidal,
    "learned": _learned,
    "learned_clamp": _learned_clamp,
    "none": _no_positions,
}
"""The position schemes :func:`length_generalisation` knows by name. Each builds a whole model from a
:class:`ClaimsConfig` whose ``block_size`` is the training length :math:`C` and whose ``max_len`` is
the evaluation length. ``"learned"``: a table with a row for every evaluated position, of which
training reaches only the first :math:`C` (the others keep their initial values, shrunk by weight
decay); ``"learned_clamp"``: a table of :math:`C` rows, later positions reuse the last one."""


def length_generalisation(
    positions: str | Callable | Sequence[str | Callable] | Mapping[str, str | Callable] = (
        "sinusoidal", "learned", "learned_clamp", "none"),
    setting: str | ClaimsRecipe = "small", seeds: Sequence[int] | None = None,
    device: torch.device | str = "cpu", steps: int | None = None, log=None,
    factor: int | None = None,
) -> ClaimResult:  # fmt: skip
    """Claim 6 (the notes, sec. 2.14.4): train on windows of :math:`C` tokens, then measure the loss at
    every position of held-out windows ``factor`` times longer (:func:`loss_by_position`).

    Args:
        positions: the scheme(s): a name of :data:`POSITION_SCHEMES`, a callable
            ``scheme(config: ClaimsConfig) -> nn.Module`` building a whole model
            (``model(idx (B, N)) -> (logits (B, N, |V|), ...)`` for every ``N <= config.max_len``;
            e.g. a :class:`ClaimsLM` with a position layer or a block of one's own), a sequence of
            those, or a mapping ``{label: scheme}``. The first is the baseline.
        factor: evaluation length over training length (default: the recipe's ``length_factor``).

    Figures per run: ``loss_in_range`` (the mean of the loss by position :math:`\\mathcal L_n`, book
    eq. ``eq-claims-position-loss``, over the trained positions :math:`n = 1, \\dots, C`),
    ``loss_beyond`` (over :math:`n = C + 1, \\dots, \\text{factor}\\cdot C`, the claim's metric) and
    ``loss_by_position`` (:math:`\\mathcal L_1, \\mathcal L_2, \\dots` in order).
    """
    recipe = _recipe(setting)
    factor = recipe.length_factor if factor is None else factor
    if factor < 2:
        raise ValueError(f"factor must be >= 2 to reach untrained positions, got {factor}")
    if isinstance(positions, (str, Callable)) and not isinstance(positions, Mapping):
        positions = [positions]
    if not isinstance(positions, Mapping):
        positions = {p if isinstance(p, str) else getattr(p, "__name__", f"scheme{i}"): p
                     for i, p in enumerate(positions)}  # fmt: skip
    schemes = {}
    for label, scheme in positions.items():
        if isinstance(scheme, str):
            if scheme not in POSITION_SCHEMES:
                raise ValueError(
                    f"unknown position scheme {scheme!r}; choose from {sorted(POSITION_SCHEMES)} or "
                    "pass a callable scheme(config) -> model"
                )
            scheme = POSITION_SCHEMES[scheme]
        if not callable(scheme):
            raise TypeError(
                f"scheme {label!r} must be a name or a callable, got {type(scheme).__name__}"
            )
        schemes[label] = scheme
    C = recipe.model.block_size
    long = _held_out(factor * C, recipe, device)

    def measure(model, when, cfg):
        if when != "final":
            return {}
        ell = loss_by_position(model, long)  # (factor * C,)
        return {"loss_in_range": ell[:C].mean().item(), "loss_beyond": ell[C:].mean().item(),
                "loss_by_position": [round(v, 4) for v in ell.tolist()]}  # fmt: skip

    variants = [Variant(label, scheme, config={"max_len": factor * C})
                for label, scheme in schemes.items()]  # fmt: skip
    return run_variants("length", variants, recipe, seeds, device, steps, measure,
                        metric="loss_beyond", log=log)  # fmt: skip


CLAIMS: dict[str, Callable[..., ClaimResult]] = {
    "tied_qk": separate_vs_tied_qk,
    "batchnorm": layernorm_vs_batchnorm,
    "concat": added_vs_concatenated,
    "norm_position": pre_vs_post_norm,
    "scale": scaled_vs_unscaled,
    "length": length_generalisation,
}
"""The claims by the short names ``bench/claims.py --claim`` takes, in the chapter's order."""
