"""Data as tokens: characters, byte-pair encoding and image patches.

Chapter: *Data as tokens* (Turner 2023, sec. 1; MIT 6.390, sec. 9.2; the lecture notes on Bishop &
Bishop's chapter 12, sec. 2.3 and 2.5). A transformer never sees text or pixels, only a sequence of
tokens. This subpackage turns data into tokens, one file per part:

* ``chars.py``: :class:`CharTokenizer`, one token per character, the vocabulary being the sorted
  distinct characters of a text (tiny-shakespeare gives 65).
* ``pretokenize.py``: the pieces BPE works inside (:func:`pretokenize`, the course's pattern or
  GPT-2's, :func:`gpt2_pattern`) and special tokens (:func:`split_special`).
* ``bpe.py``: :class:`BPETokenizer`, byte-pair encoding (Sennrich et al. 2016) on UTF-8 bytes, so
  every string can be encoded and there is no "unknown character"; special tokens such as
  ``"<|endoftext|>"``; a tokenizer from a ranks table such as GPT-2's
  (:meth:`BPETokenizer.from_ranks`); streaming (:meth:`BPETokenizer.encode_iterable`).
  :func:`pair_counts` and :func:`merge_pair` are one training step by hand.
* ``bpe_train.py``: learning the merges, by recounting (:func:`train_merges_reference`) and by
  updating only the counts a merge changes (:func:`train_merges`), tested equal.
* ``gpt2.py``: GPT-2's published ranks (:func:`read_tiktoken`), the sample that ships with the
  package, with tiktoken's ids for it (:func:`gpt2_sample`), and GPT-2's whole tokenizer from the full
  table, downloaded or from a file (:func:`gpt2_tokenizer`).
* ``embedding.py``: :func:`embedding` and :func:`embedding_reference`, token ids to vectors, a row
  lookup in an embedding matrix ``E`` (``|V| x D``, ``|V|`` the vocabulary size), equal to one-hot
  vectors times ``E`` (``eq-tok-onehot``).
* ``patches.py``: :func:`patchify` and :class:`PatchEmbedding`, an image cut into ``P x P`` patches,
  each flattened (the rows ``p_n`` of the book's ``X_pix``) and mapped linearly to a ``d_model``
  vector, ``x_n = W_p p_n + b`` (Turner 2023, fig. 2, where the map is ``W``; Dosovitskiy et al.
  2021); :func:`patchify_1d` for windows of a series. Convention: rows are tokens, so a batch of
  images becomes ``(B, N, d_model)``.
"""

from __future__ import annotations

from .bpe import BPETokenizer, merge_pair, pair_counts
from .bpe_train import train_merges, train_merges_reference
from .chars import CharTokenizer
from .embedding import embedding, embedding_reference
from .gpt2 import ENDOFTEXT, GPT2_RANKS_URL, GPT2Sample, gpt2_sample, gpt2_tokenizer, read_tiktoken
from .patches import PatchEmbedding, patchify, patchify_1d, unpatchify
from .pretokenize import GPT2_REGEX, PATTERNS, gpt2_pattern, pretokenize, split_special

__all__ = [
    "ENDOFTEXT",
    "GPT2_RANKS_URL",
    "GPT2_REGEX",
    "PATTERNS",
    "BPETokenizer",
    "CharTokenizer",
    "GPT2Sample",
    "PatchEmbedding",
    "embedding",
    "embedding_reference",
    "gpt2_pattern",
    "gpt2_sample",
    "gpt2_tokenizer",
    "merge_pair",
    "pair_counts",
    "patchify",
    "patchify_1d",
    "pretokenize",
    "read_tiktoken",
    "split_special",
    "train_merges",
    "train_merges_reference",
    "unpatchify",
]
