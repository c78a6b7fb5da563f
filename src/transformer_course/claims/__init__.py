"""Claims tested: design claims of the sources as seeded, paired experiments on a small language model.

Chapter: *Claims tested*. Each claim becomes one function that trains the same small character model
(:class:`ClaimsLM`, built from the package's blocks, stack and position codes) on tiny-shakespeare with
the one training loop (:func:`.train.train`), once per variant and seed, and returns every run
(:class:`ClaimResult`). Runs that share a seed share the order of the training batches, so variants are
compared seed by seed (:meth:`ClaimResult.compare`: the paired difference, a t-interval and an exact sign
test, computed here without scipy and tested against it).

The claims and their functions (``CLAIMS`` maps the short names the benchmark uses to them):

* ``tied_qk``, :func:`separate_vs_tied_qk`: one map for queries and keys, ``W_q = W_k``, against two
  (Turner 2023, footnote 9);
* ``batchnorm``, :func:`layernorm_vs_batchnorm`: BatchNorm in place of LayerNorm (Turner fig. 5; Shen
  et al. 2020);
* ``concat``, :func:`added_vs_concatenated`: position codes added to or concatenated with the token
  vectors (Turner footnote 19; the lecture notes on Bishop and Bishop's chapter 12, ``bishop2024notes``,
  sec. 2.14.1, cited below as *the notes*);
* ``norm_position``, :func:`pre_vs_post_norm`: pre-norm against post-norm blocks as depth grows, with
  and without learning-rate warm-up (the notes' eqs. 20-23; Xiong et al. 2020);
* ``scale``, :func:`scaled_vs_unscaled`: attention with and without the ``1/sqrt(d_k)`` scale, and the
  saturation of the softmax it prevents (the notes, sec. 2.10);
* ``length``, :func:`length_generalisation`: positions beyond the training length for sinusoidal,
  learned and no position codes (the notes, sec. 2.14.4); the scheme is an argument, so other chapters can
  add theirs.

Every setting is fixed here, in ``SETTINGS["small"]`` for the book's live runs and the tests and
``SETTINGS["large"]`` for ``bench/claims.py``, whose results the chapter reads (:func:`load_recorded`).
They were fixed before the recorded runs, except three groups of arms added after a first look, to test
a mechanism (BatchNorm at a small batch, concatenation with GPT-2's embedding initialisation, post-norm
from Xavier weights); the functions' docstrings and the chapter say which.
"""

from __future__ import annotations

from .experiments import (
    CLAIMS,
    POSITION_SCHEMES,
    added_vs_concatenated,
    layernorm_vs_batchnorm,
    length_generalisation,
    pre_vs_post_norm,
    scaled_vs_unscaled,
    separate_vs_tied_qk,
)
from .measurements import attention_maps, fc2_gradient_norms, loss_by_position, normalised_entropy
from .model import EMBEDDING_STD, ClaimsConfig, ClaimsLM, unit_variance_qk_, xavier_linear_
from .positions import AddedPositions, ConcatenatedPositions, NoPositions, SinusoidalPositions
from .recipes import (
    LARGE,
    LR_GRID,
    SETTINGS,
    SMALL,
    ClaimsRecipe,
    _corpus,  # noqa: F401 (the chapter reads the corpus the runs train on)
    at_rate,
)
from .recorded import at_best_rates, best_rates, load_lr_grid, load_recorded, plot_seeds
from .runs import ClaimResult, PairedComparison, Run, Variant, run_variants
from .stats import paired_t_interval, sign_test, student_t_cdf, student_t_quantile, width_ratio
from .variants import (
    BatchNormBlock,
    TiedQKBlock,
    TiedQKSelfAttention,
    TokenBatchNorm,
    UnscaledBlock,
    UnscaledSelfAttention,
)

__all__ = [
    "CLAIMS",
    "EMBEDDING_STD",
    "LARGE",
    "LR_GRID",
    "POSITION_SCHEMES",
    "SETTINGS",
    "SMALL",
    "AddedPositions",
    "BatchNormBlock",
    "ClaimResult",
    "ClaimsConfig",
    "ClaimsLM",
    "ClaimsRecipe",
    "ConcatenatedPositions",
    "NoPositions",
    "PairedComparison",
    "Run",
    "SinusoidalPositions",
    "TiedQKBlock",
    "TiedQKSelfAttention",
    "TokenBatchNorm",
    "UnscaledBlock",
    "UnscaledSelfAttention",
    "Variant",
    "added_vs_concatenated",
    "at_best_rates",
    "at_rate",
    "attention_maps",
    "best_rates",
    "fc2_gradient_norms",
    "layernorm_vs_batchnorm",
    "length_generalisation",
    "load_lr_grid",
    "load_recorded",
    "loss_by_position",
    "normalised_entropy",
    "paired_t_interval",
    "plot_seeds",
    "pre_vs_post_norm",
    "run_variants",
    "scaled_vs_unscaled",
    "separate_vs_tied_qk",
    "sign_test",
    "student_t_cdf",
    "student_t_quantile",
    "unit_variance_qk_",
    "width_ratio",
    "xavier_linear_",
]
