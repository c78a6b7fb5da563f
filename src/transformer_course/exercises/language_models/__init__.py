"""Exercises of the *Autoregressive language models* lab (Lab 7, the capstone), one file per part.

Two kinds:

* small functions checked on random inputs, as in every lab (:mod:`.warmups`): the causal mask in MIT's
  and Turner's conventions, the temperature and top-k sampling distributions, the teacher-forcing loss;
* **the capstone**: the learner writes a GPT against fixed interfaces (the pattern of Stanford's
  CS336, assignment 1), with the names of ``scratch/gpt.py``, whose classes and functions are the
  reference solutions (imported, never copied): ``Embedding`` (:mod:`.embedding`, part 1),
  ``CausalSelfAttention`` (:mod:`.attention`, part 2), ``Block`` (:mod:`.block`, part 3), ``GPT``
  (:mod:`.gpt`, part 4), ``get_batch`` (:mod:`.batches`, part 5: the package's own
  :func:`~transformer_course.data.get_batch`), ``train_loop``
  (:mod:`.training`, part 6: scratch's ``train``), then :func:`train_gpt` (part 7: the learner's GPT
  trained on tiny-shakespeare, or the chapter's own run while every part is the reference solution) and
  ``generate`` (:mod:`.generation`, part 8); then
  the key-value cache of part 9 (:mod:`.kv_cache`), ``KVCache``, the cached model as subclasses of the
  learner's classes and ``generate_cached``, whose reference solutions subclass the scratch classes.

The model checkers (:mod:`.checking`) build the package's
:class:`~transformer_course.language_models.GPT` with seeded weights (:func:`package_gpt`), load them
into the learner's module under the lab's parameter names (:func:`lab_names`, :func:`lab_state_dict`,
:func:`parameter_table`: the package's fused ``in_proj`` split into ``W_q, W_k, W_v``), compare the
outputs in float64 and, when they differ, name the typical mistake that explains the difference: each
:class:`~transformer_course.checks.Mistake` is a wrong model built from the same weights (post-norm
blocks, no causal mask, positions off by one, ...). When no single mistake explains it, the checker
says which part departs from the package (the embedding, block ``l``'s attention, the final norm, ...).

Chapter: *Autoregressive language models* (Turner 2023 sec. 4.1 and footnotes 20-22; MIT 6.390 sec.
9.5.2; Dramko 2025 sec. 5.2-5.3; Karpathy 2023, *Let's build GPT*). Inputs are float64 so the checkers
can use tight tolerances.
"""

from __future__ import annotations

from .attention import CausalSelfAttention
from .batches import get_batch
from .block import Block
from .checking import CapstoneExercise, lab_names, lab_state_dict, package_gpt, parameter_table
from .embedding import Embedding
from .generation import generate
from .gpt import GPT
from .kv_cache import CachedAttention, CachedBlock, CachedGPT, KVCache, generate_cached
from .training import train as train_loop
from .training import train_gpt
from .warmups import (
    mit_causal_weights,
    teacher_forcing_loss,
    temperature_probs,
    top_k_probs,
    turner_causal_weights,
)

__all__ = [
    "GPT",
    "Block",
    "CachedAttention",
    "CachedBlock",
    "CachedGPT",
    "CapstoneExercise",
    "CausalSelfAttention",
    "Embedding",
    "KVCache",
    "generate",
    "generate_cached",
    "get_batch",
    "lab_names",
    "lab_state_dict",
    "mit_causal_weights",
    "package_gpt",
    "parameter_table",
    "teacher_forcing_loss",
    "temperature_probs",
    "top_k_probs",
    "train_gpt",
    "train_loop",
    "turner_causal_weights",
]
