r"""Learning BPE merges: the readable recount and the fast incremental trainer, which give the same
merges.

Both take the training text as *words*: each distinct piece of the pre-tokenized text as a tuple of
ids (its UTF-8 bytes at first) with its frequency ``f_w``. Both learn merges by one rule (Sennrich et
al. 2016, with the byte-level start of GPT-2): the most frequent adjacent pair of ids, counted at every
position of every word, weighted by the word's frequency (eq. ``eq-tok-bpe-pair``); on a tie the
smallest pair of ids, compared as tuples; merge ``k`` (from 0) creates id ``first_id + k``.

* :func:`train_merges_reference` recounts every pair of every word after each merge: the rule as
  written, and slow (each merge costs a pass over the whole text).
* :func:`train_merges` counts once, then after each merge updates only the counts of the pairs in
  the words that held the merged pair (eq. ``eq-tok-bpe-update``), using an index from each pair to
  the words holding it and a heap of ``(-count, pair)`` entries whose stale entries are skipped when
  they surface (lazy deletion). The tests check that it learns exactly the reference's merges.
"""

from __future__ import annotations

import heapq
from collections import Counter, defaultdict
from collections.abc import Sequence
from itertools import pairwise

__all__ = ["train_merges", "train_merges_reference"]

Words = dict[tuple[int, ...], int]  # a word (a piece, as ids) -> its frequency f_w


def _merge(word: Sequence[int], pair: tuple[int, int], new_id: int) -> tuple[int, ...]:
    """Replace each occurrence of ``pair`` in ``word``, left to right, by ``new_id``."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _count_pairs(words: Words) -> Counter[tuple[int, int]]:
    """How often each adjacent pair of ids occurs, each word weighted by its frequency."""
    counts: Counter[tuple[int, int]] = Counter()
    for word, freq in words.items():
        for pair in pairwise(word):
            counts[pair] += freq
    return counts


def train_merges_reference(
    words: Words, n_merges: int, first_id: int = 256
) -> list[tuple[int, int]]:
    """Learn up to ``n_merges`` merges by recounting every pair after each merge (the readable rule).

    Each round counts the pairs of all words (eq. ``eq-tok-bpe-pair``), merges the most frequent
    pair (the smallest pair of ids on a tie) in every word, and records it. Stops early when no word
    has two ids left.

    Implements: eq-tok-bpe-pair
    """
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges:
        counts = _count_pairs(words)
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))  # most frequent, then smallest
        new_id = first_id + len(merges)
        merged: Counter[tuple[int, ...]] = Counter()
        for word, freq in words.items():
            merged[_merge(word, best, new_id) if best[0] in word else word] += freq
        words = merged
        merges.append(best)
    return merges


def train_merges(words: Words, n_merges: int, first_id: int = 256) -> list[tuple[int, int]]:
    r"""Learn the same merges as :func:`train_merges_reference`, updating counts instead of recounting.

    After merging the pair :math:`(v^\ast, v'^\ast)` into a new id, a word :math:`w` that held it
    becomes :math:`\tilde{w}`, and the count of every pair :math:`(v, v')` changes by
    :math:`f_w\,(n_{\tilde{w}}(v, v') - n_w(v, v'))`, summed over those words only (eq.
    ``eq-tok-bpe-update``; :math:`n_w(v, v')` counts the positions of the pair in :math:`w`). Words
    that do not hold the merged pair are untouched, so a merge costs time in proportion to the words
    it changes.

    * ``where[p]``: the words that hold ``p`` (it may also list words that no longer do; merging such
      a word changes nothing, and it is skipped);
    * ``heap``: ``(-count, pair)`` entries. A count change pushes a new entry and leaves the old one
      in place; an entry is valid when its count equals the pair's current count. The first valid
      entry popped is the most frequent pair, the smallest on a tie: the reference's choice.

    Implements: eq-tok-bpe-pair, eq-tok-bpe-update
    """
    seqs = [tuple(w) for w in words]  # word i, as it is now
    freqs = list(words.values())  # f_w
    counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for i, word in enumerate(seqs):
        for pair in pairwise(word):
            counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-c, pair) for pair, c in counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[int, int]] = []
    while len(merges) < n_merges:
        while heap and counts.get(heap[0][1], 0) != -heap[0][0]:
            heapq.heappop(heap)  # stale: the pair's count changed since this entry was pushed
        if not heap:
            break  # no word has two ids left
        best = heapq.heappop(heap)[1]
        new_id = first_id + len(merges)
        touched: set[tuple[int, int]] = set()
        for i in where.pop(best):
            old = seqs[i]
            new = _merge(old, best, new_id)
            if len(new) == len(old):
                continue  # listed, but no longer holds the pair
            f = freqs[i]
            for pair in pairwise(old):  # eq. (eq-tok-bpe-update): - f_w n_w(pair) ...
                counts[pair] -= f
                touched.add(pair)
            for pair in pairwise(new):  # ... + f_w n_w~(pair), w~ the word after the merge
                counts[pair] += f
                where[pair].add(i)
                touched.add(pair)
            seqs[i] = new
        for pair in touched:
            if counts[pair] > 0:
                heapq.heappush(heap, (-counts[pair], pair))
            else:
                del counts[pair]  # gone from every word (the merged pair among them)
        merges.append(best)
    return merges
