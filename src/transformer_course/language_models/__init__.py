"""Autoregressive language models: a decoder-only GPT, generation, measurements and its recipe.

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1; MIT 6.390 sec. 9.1 and 9.5.2; Dramko
2025 sec. 5.2-5.3; Pope et al. 2023 on the cache). One file per part, each name re-exported here
(``tc.language_models.GPT``):

* :mod:`.model`: :class:`GPTConfig`, its presets (:data:`TINY`, :data:`SHAKESPEARE_CHAPTER`,
  :data:`SHAKESPEARE_CPU`, :data:`SHAKESPEARE_GPU`), nanoGPT's GPT-2-style initialisation
  :func:`gpt2_init`, the model :class:`GPT` (``GPT.from_huggingface`` loads GPT-2's weights,
  through :func:`gpt2_state_dict`), and the one map between its parameters and
  ``scratch/gpt.py``'s (:func:`scratch_names`, :func:`scratch_state_dict`, :func:`gpt_from_scratch`);
* :mod:`.generation`: the next token's distribution and choice, :func:`window_start` (the context
  policy: the window jumps, so that a cache is rebuilt once per jump) and :func:`generate`, with and
  without the key-value cache;
* :mod:`.evaluation`: perplexity, bits per token, the unigram and bigram baselines the GPT is measured
  against, and the attention maps of every head;
* :mod:`.exposure`: the measurements of the section on exposure bias;
* :mod:`.recipe`: the CPU, minute and GPU recipes, :func:`seconds_per_step` and :func:`fit_to_time`
  (a recipe's step count fitted to a time on this machine); :func:`train_scratch_gpt`, the run of the
  chapter and its lab (``scratch/gpt.py``'s GPT and loop), and :func:`train_char_lm`, the package's
  GPT with the shared loop (``bench/lm.py`` and the chapters that compare models).

The key-value cache, :class:`KVCache`, is taught here but lives in :mod:`..kv_cache`, shared
infrastructure below the layers that take it (:mod:`..multihead`, :mod:`..block`). The from-scratch GPT
that the chapter shows and lab 7 writes is ``scratch/gpt.py``.
"""

from __future__ import annotations

from ..kv_cache import KVCache
from .evaluation import (
    attention_maps,
    bigram_log_probs,
    bits_per_token,
    perplexity,
    unigram_log_probs,
)
from .exposure import (
    continuation_loss,
    replace_prefix_tokens,
    sample_under_teacher_forcing,
    teacher_forced_vs_free_running,
)
from .generation import (
    generate,
    generate_bigram,
    generate_text,
    generate_with_logits,
    next_token,
    next_token_probs,
    positions_processed,
    side_by_side,
    window_start,
)
from .model import (
    GPT,
    SHAKESPEARE_CHAPTER,
    SHAKESPEARE_CPU,
    SHAKESPEARE_GPU,
    TINY,
    GPTConfig,
    gpt2_init,
    gpt2_state_dict,
    gpt_from_scratch,
    scratch_names,
    scratch_state_dict,
)
from .recipe import (
    SHAKESPEARE_CHAPTER_RECIPE,
    SHAKESPEARE_CPU_RECIPE,
    SHAKESPEARE_GPU_RECIPE,
    SHAKESPEARE_MINUTE_RECIPE,
    LMRecipe,
    LMRun,
    ScratchRun,
    fit_to_time,
    seconds_per_step,
    shakespeare_split,
    train_char_lm,
    train_scratch_gpt,
    validation_loss,
)

__all__ = [
    "GPT",
    "SHAKESPEARE_CHAPTER",
    "SHAKESPEARE_CHAPTER_RECIPE",
    "SHAKESPEARE_CPU",
    "SHAKESPEARE_CPU_RECIPE",
    "SHAKESPEARE_GPU",
    "SHAKESPEARE_GPU_RECIPE",
    "SHAKESPEARE_MINUTE_RECIPE",
    "TINY",
    "GPTConfig",
    "KVCache",
    "LMRecipe",
    "LMRun",
    "ScratchRun",
    "attention_maps",
    "bigram_log_probs",
    "bits_per_token",
    "continuation_loss",
    "fit_to_time",
    "generate",
    "generate_bigram",
    "generate_text",
    "generate_with_logits",
    "gpt2_init",
    "gpt2_state_dict",
    "gpt_from_scratch",
    "next_token",
    "next_token_probs",
    "perplexity",
    "positions_processed",
    "replace_prefix_tokens",
    "sample_under_teacher_forcing",
    "scratch_names",
    "scratch_state_dict",
    "seconds_per_step",
    "shakespeare_split",
    "side_by_side",
    "teacher_forced_vs_free_running",
    "train_char_lm",
    "train_scratch_gpt",
    "unigram_log_probs",
    "validation_loss",
    "window_start",
]
