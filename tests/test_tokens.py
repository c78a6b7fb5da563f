"""Tests for transformer_course.tokens: hand-computed cases, round trips and error messages."""

from __future__ import annotations

import itertools
import random
import re
import sys
import unicodedata
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import pytest
import torch

import transformer_course as tc
from transformer_course.exercises import check, list_exercises
from transformer_course.exercises import tokens as ex_tokens
from transformer_course.tokens import (
    BPETokenizer,
    CharTokenizer,
    PatchEmbedding,
    patchify,
    unpatchify,
)

# ----------------------------------------------------------------------------------------------
# The module

SHAKESPEARE = Path("/work/shared/data/tinyshakespeare/input.txt")
ALPHABET = "abcde fgh\nXYZ.,!?'éßñ中文日本😀🙂ü\t0123_"


def random_text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(n))


# ------------------------------------------------------------------------------------------------
# CharTokenizer
# ------------------------------------------------------------------------------------------------


def test_char_vocab_by_hand():
    tok = CharTokenizer.from_text("hello world")
    assert tok.itos == [" ", "d", "e", "h", "l", "o", "r", "w"]  # sorted by code point
    assert tok.vocab_size == 8
    assert tok.stoi == {" ": 0, "d": 1, "e": 2, "h": 3, "l": 4, "o": 5, "r": 6, "w": 7}
    assert tok.encode("hello") == [3, 2, 4, 4, 5]
    assert tok.decode([7, 5, 6, 4, 1]) == "world"


def test_char_round_trip_over_training_text():
    text = random_text(random.Random(0), 2000)
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.decode(ids) == text
    assert tok.decode(torch.tensor(ids)) == text  # a 1-D tensor works too


def test_char_encode_tensor():
    tok = CharTokenizer.from_text("abc")
    t = tok.encode_tensor("cab")
    assert t.dtype == torch.long and t.shape == (3,)
    assert t.tolist() == [2, 0, 1]


def test_char_unknown_characters_listed_once_in_order():
    tok = CharTokenizer.from_text("hello")
    expected = "4 character(s) not in the vocabulary of 4: 'p', ' ', 'm', '!'"
    with pytest.raises(ValueError, match=re.escape(expected)) as info:
        tok.encode("help me!! pp")
    msg = str(info.value)
    assert msg.count("'p'") == 1
    assert "from_text" in msg  # says how to fix it


def test_char_decode_out_of_range():
    tok = CharTokenizer.from_text("abc")
    with pytest.raises(ValueError, match=r"id 3 is not a token id: valid ids are 0 to 2"):
        tok.decode([0, 3])
    with pytest.raises(ValueError, match=r"id -1 "):
        tok.decode([-1])


def test_char_bad_vocabularies():
    with pytest.raises(ValueError, match="empty"):
        CharTokenizer.from_text("")
    with pytest.raises(ValueError, match="repeats"):
        CharTokenizer(["a", "b", "a"])
    with pytest.raises(ValueError, match="one character"):
        CharTokenizer(["a", "bc"])


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason="tiny-shakespeare not downloaded")
def test_char_tiny_shakespeare_has_65_symbols():
    text = SHAKESPEARE.read_text(encoding="utf-8")
    tok = CharTokenizer.from_text(text)
    assert tok.vocab_size == 65
    assert tok.decode(tok.encode(text[:5000])) == text[:5000]


@pytest.mark.skipif(not SHAKESPEARE.exists(), reason="tiny-shakespeare not downloaded")
def test_the_chapters_passages_are_the_opening_of_tiny_shakespeare():
    # book/tokens.md writes its two passages out; book/tokens_deeper.md reads the same characters
    # from the corpus (text[:3306] and text[3306:4561]).
    page = (Path(__file__).resolve().parents[1] / "book" / "tokens.md").read_text(encoding="utf-8")
    text, held_out = (
        re.search(rf'{name} = """\\\n(.*?)"""', page, re.S).group(1)
        for name in ("TEXT", "HELD_OUT")
    )
    corpus = SHAKESPEARE.read_text(encoding="utf-8")
    assert (len(text), len(held_out)) == (3306, 1255)
    assert corpus[:3306] == text and corpus[3306:4561] == held_out


# ------------------------------------------------------------------------------------------------
# BPETokenizer
# ------------------------------------------------------------------------------------------------


def test_bpe_wikipedia_example():
    # aaabdaaabac: "aa" (4 times) -> Z=256; then "Za" and "ab" tie at 2 and the smaller pair,
    # (97, 98) = "ab", wins -> Y=257 (as on Wikipedia); then "ZY" -> X=258, giving "XdXac".
    tok = BPETokenizer.train("aaabdaaabac", vocab_size=259, pattern="course")
    a, b, c, d = 97, 98, 99, 100
    assert tok.merges == [(a, a), (a, b), (256, 257)]
    assert tok.vocab[256] == b"aa" and tok.vocab[257] == b"ab" and tok.vocab[258] == b"aaab"
    assert tok.encode("aaabdaaabac") == [258, d, 258, a, c]
    assert tok.tokens_as_strings("aaabdaaabac") == ["aaab", "d", "aaab", "a", "c"]
    assert tok.vocab_size == 259


def test_bpe_ties_take_the_smallest_pair():
    tok = BPETokenizer.train("dcba", vocab_size=257, pattern="course")  # pairs dc, cb, ba all once
    assert tok.merges == [(ord("b"), ord("a"))]


def test_bpe_256_is_plain_bytes_and_stops_early():
    text = "naïve café 😀"
    tok = BPETokenizer.train(text, vocab_size=256, pattern="course")
    assert tok.merges == [] and tok.encode(text) == list(text.encode("utf-8"))
    short = BPETokenizer.train("ab", vocab_size=1000, pattern="course")  # only one pair ever exists
    assert short.merges == [(97, 98)] and short.vocab_size == 257


def test_bpe_vocab_size_too_small():
    with pytest.raises(ValueError, match=r"vocab_size=100 is too small.*256 byte values"):
        BPETokenizer.train("hello", vocab_size=100, pattern="course")


def test_bpe_round_trip_random_unicode():
    rng = random.Random(1)
    tok = BPETokenizer.train(random_text(rng, 3000), vocab_size=320, pattern="course")
    assert tok.vocab_size == 320
    for _ in range(50):
        s = random_text(rng, rng.randrange(0, 60))
        assert tok.decode(tok.encode(s)) == s
    unseen = "Ωμέγα ∑ \x00 \U0010ffff"  # characters never seen in training still round-trip
    assert tok.decode(tok.encode(unseen)) == unseen


def test_bpe_encode_matches_merges_applied_in_order():
    """Encoding equals the textbook procedure: run through every merge in order, over each piece."""
    rng = random.Random(2)
    tok = BPETokenizer.train(random_text(rng, 2000), vocab_size=300, pattern="course")

    def slow(piece: str) -> list[int]:
        ids = list(piece.encode("utf-8"))
        for k, (a, b) in enumerate(tok.merges):
            out, i = [], 0
            while i < len(ids):
                if i + 1 < len(ids) and ids[i] == a and ids[i + 1] == b:
                    out.append(256 + k)
                    i += 2
                else:
                    out.append(ids[i])
                    i += 1
            ids = out
        return ids

    for _ in range(30):
        s = random_text(rng, 40)
        pieces = re.findall(r" ?\w+| ?[^\w\s]+|\s+", s)
        assert "".join(pieces) == s
        assert tok.encode(s) == [i for p in pieces for i in slow(p)]


def test_bpe_vocab_is_consistent_and_compresses():
    text = "the evaluation of the evaluator " * 20
    tok = BPETokenizer.train(text, vocab_size=290, pattern="course")
    for k, (a, b) in enumerate(tok.merges):
        assert tok.vocab[256 + k] == tok.vocab[a] + tok.vocab[b]
    assert tok.tokens_as_strings(" evaluation") == [" evaluation"]  # frequent word -> one token
    assert len(tok.encode(text)) < len(text.encode("utf-8")) // 5


def test_bpe_tokens_as_strings_shows_partial_bytes():
    tok = BPETokenizer.train("abc", vocab_size=256, pattern="course")
    assert tok.tokens_as_strings("é") == ["\\xc3", "\\xa9"]
    assert tok.decode([0xC3]) == "\ufffd"  # half a character decodes to the replacement mark


def test_bpe_decode_unknown_id():
    tok = BPETokenizer.train("aaaa", vocab_size=257, pattern="course")
    with pytest.raises(ValueError, match=r"id 257 is not a token id: valid ids are 0 to 256"):
        tok.decode([97, 257])


def test_every_way_of_building_a_bpe_tokenizer_names_its_pre_tokenization():
    """No default: merges learned on one pattern's pieces, applied with another's, tokenize other
    pieces without any error."""
    for build in (
        lambda: BPETokenizer([(97, 98)]),
        lambda: BPETokenizer.train("ab ab", 257),
        lambda: BPETokenizer.train_reference("ab ab", 257),
        lambda: BPETokenizer.from_ranks({bytes([b]): b for b in range(256)}),
    ):
        with pytest.raises(TypeError, match="pattern"):
            build()
    text = "I'm sure they'll say we're fine"
    gpt2_merges = BPETokenizer.train(text * 30, 300, pattern="gpt2").merges
    right = BPETokenizer(gpt2_merges, pattern="gpt2")
    wrong = BPETokenizer(gpt2_merges, pattern="course")  # what the old default gave, silently
    assert right.tokens_as_strings("I'm")[-1] == "'m"
    assert right.encode(text) != wrong.encode(text)
    assert repr(right) == f"BPETokenizer(vocab_size={256 + len(gpt2_merges)}, pattern='gpt2')"


def test_merges_as_byte_pairs_equal_the_same_merges_as_id_pairs():
    rng = random.Random(3)
    tok = BPETokenizer.train(random_text(rng, 3000), vocab_size=340, pattern="course")
    as_bytes = [(tok.vocab[a], tok.vocab[b]) for a, b in tok.merges]
    mixed = [pair if k % 2 else as_bytes[k] for k, pair in enumerate(tok.merges)]
    for merges in (as_bytes, mixed):
        other = BPETokenizer(merges, pattern="course")
        assert other.merges == tok.merges and other.vocab == tok.vocab
        s = random_text(rng, 200)
        assert other.encode(s) == tok.encode(s)
    # NumPy and tensor integers are ids too, and a merge list may be an array
    assert BPETokenizer([(torch.tensor(97), 98)], pattern="course").merges == [(97, 98)]
    assert BPETokenizer(torch.tensor(tok.merges), pattern="course").merges == tok.merges


def test_merge_errors_name_the_merge_and_the_missing_token():
    with pytest.raises(ValueError, match=r"merge 1 joins \(b'ab', b'x'\) but b'ab' is not a token"):
        BPETokenizer([(b"b", b"c"), (b"ab", b"x")], pattern="course")  # b'ab' was never made
    with pytest.raises(ValueError, match=r"merge 0 joins \(97, 256\) but only ids 0 to 255 exist"):
        BPETokenizer([(97, 256)], pattern="course")
    with pytest.raises(TypeError, match=r"merge 0 is \('a', 'b'\): each side .* not str"):
        BPETokenizer([("a", "b")], pattern="course")
    with pytest.raises(TypeError, match=r"merge 0 is \(97,\); each merge is a pair"):
        BPETokenizer([(97,)], pattern="course")
    with pytest.raises(TypeError, match=r"merge 0 is b'ab'; each merge is a pair"):
        BPETokenizer([b"ab"], pattern="course")  # not the ids 97 and 98


def test_vocab_holds_every_id_that_vocab_size_counts():
    tok = BPETokenizer.train(f"ab{EOT}abc", vocab_size=300, special_tokens=[EOT], pattern="course")
    assert len(tok.vocab) == tok.vocab_size == 256 + len(tok.merges) + 1
    assert tok.vocab[tok.special_tokens[EOT]] == EOT.encode()
    assert all(tok.decode([i]).encode() == token for i, token in tok.vocab.items() if i >= 256)


# ------------------------------------------------------------------------------------------------
# Patches
# ------------------------------------------------------------------------------------------------


def test_patchify_by_hand():
    img = torch.arange(16.0).reshape(1, 1, 4, 4)
    p = patchify(img, 2)
    assert p.shape == (1, 4, 4)
    assert p[0].tolist() == [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]


def test_patchify_matches_double_loop():
    torch.manual_seed(0)
    B, C, H, W, P = 2, 3, 6, 8, 2
    images = torch.randn(B, C, H, W)
    expected = torch.stack(
        [
            images[:, :, i * P : (i + 1) * P, j * P : (j + 1) * P].reshape(B, C * P * P)
            for i in range(H // P)  # row-major: patch rows outer, patch columns inner
            for j in range(W // P)
        ],
        dim=1,
    )
    assert torch.equal(patchify(images, P), expected)


def test_unpatchify_inverts_patchify():
    torch.manual_seed(1)
    images = torch.randn(2, 3, 4, 6)
    patches = patchify(images, 2)
    assert patches.shape == (2, 6, 12)
    assert torch.equal(unpatchify(patches, 2, (4, 6), 3), images)
    square = torch.randn(1, 1, 6, 6)
    assert torch.equal(unpatchify(patchify(square, 3), 3, 6, 1), square)
    with pytest.raises(ValueError, match=r"need \(B, N, C_in\*P\*P\) = \(B, 6, 12\)"):
        unpatchify(patches[:, :5], 2, (4, 6), 3)


def test_patchify_errors():
    with pytest.raises(ValueError, match=r"5 x 6 is not divisible by patch_size=2"):
        patchify(torch.zeros(1, 3, 5, 6), 2)
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        patchify(torch.zeros(3, 4, 4), 2)
    with pytest.raises(ValueError, match="positive int"):
        patchify(torch.zeros(1, 3, 4, 4), 0)


def test_patch_embedding_equation_and_conv2d():
    torch.manual_seed(2)
    emb = PatchEmbedding(patch_size=4, channels=3, d_model=5).double()
    images = torch.randn(2, 3, 8, 12, dtype=torch.float64)
    X = emb(images)
    assert X.shape == (2, 6, 5)
    W, b = emb.proj.weight, emb.proj.bias  # W is (d_model, C*P*P)
    torch.testing.assert_close(X, patchify(images, 4) @ W.T + b, rtol=0, atol=1e-10)
    conv = emb.as_conv2d()
    Y = conv(images).flatten(2).transpose(1, 2)  # (B, d_model, H/P, W/P) -> (B, N, d_model)
    torch.testing.assert_close(X, Y, rtol=0, atol=1e-10)


def test_patch_embedding_without_bias_and_wrong_channels():
    emb = PatchEmbedding(2, 1, 3, bias=False)
    assert emb.proj.bias is None and emb.as_conv2d().bias is None
    assert emb(torch.zeros(1, 1, 4, 4)).abs().sum() == 0  # linear, no bias: zero in, zero out
    with pytest.raises(ValueError, match=r"C_in=3 channels but this PatchEmbedding .* channels=1"):
        emb(torch.zeros(1, 3, 4, 4))


# ------------------------------------------------------------------------------------------------
# One BPE step: pair counts and a merge
# ------------------------------------------------------------------------------------------------


def test_pair_counts_by_hand():
    from transformer_course.tokens import pair_counts

    assert pair_counts([1, 1, 1]) == {(1, 1): 2}  # overlapping positions both count
    assert pair_counts(torch.tensor([5, 6, 5, 6])) == {(5, 6): 2, (6, 5): 1}
    assert pair_counts([7]) == {} and pair_counts([]) == {}


def test_merge_pair_by_hand_and_errors():
    from transformer_course.tokens import merge_pair

    assert merge_pair([1, 1, 1], (1, 1), 9) == [9, 1]  # left to right, no overlap
    assert merge_pair([1, 2, 3, 1, 2], (1, 2), 9) == [9, 3, 9]
    assert merge_pair(torch.tensor([2, 1]), (1, 2), 9) == [2, 1]  # order inside a pair matters
    with pytest.raises(ValueError, match="pair must be two ids"):
        merge_pair([1, 2], (1, 2, 3), 9)
    with pytest.raises(ValueError, match=r"new_id=2 already occurs in ids"):
        merge_pair([1, 2], (1, 2), 2)


def test_first_bpe_merge_is_the_most_frequent_pair():
    from transformer_course.tokens import merge_pair, pair_counts

    text = "abab cab abba"
    tok = BPETokenizer.train(text, vocab_size=257, pattern="course")
    counts: dict[tuple[int, int], int] = {}
    for piece in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text):  # pairs never cross a piece
        for pair, c in pair_counts(list(piece.encode())).items():
            counts[pair] = counts.get(pair, 0) + c
    best = min(counts, key=lambda p: (-counts[p], p))
    assert tok.merges == [best] == [(ord("a"), ord("b"))]
    ids = list(b"abab")
    assert tok.encode("abab") == merge_pair(ids, best, 256) == [256, 256]


# ------------------------------------------------------------------------------------------------
# Embeddings
# ------------------------------------------------------------------------------------------------


def test_embedding_by_hand():
    from transformer_course.tokens import embedding, embedding_reference

    E = torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    ids = torch.tensor([2, 0, 2])
    expected = torch.tensor([[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]])
    assert torch.equal(embedding(ids, E), expected)
    assert torch.equal(embedding_reference(ids, E), expected)


def test_embedding_matches_one_hot_and_nn_embedding(gen):
    from transformer_course.tokens import embedding, embedding_reference

    V, D = 11, 4
    E = torch.randn(V, D, generator=gen, dtype=torch.float64)
    ids = torch.randint(0, V, (3, 7), generator=gen)  # any batch shape
    X = embedding(ids, E)
    assert X.shape == (3, 7, D) and X.dtype == torch.float64
    torch.testing.assert_close(embedding_reference(ids, E), X, rtol=0, atol=1e-12)
    layer = torch.nn.Embedding(V, D, dtype=torch.float64)
    with torch.no_grad():
        layer.weight.copy_(E)  # nn.Embedding stores E as (V, D): no transpose
    torch.testing.assert_close(layer(ids), X, rtol=0, atol=0)
    assert torch.equal(embedding(ids.to(torch.int32), E), X)  # int32 ids work too


def test_embedding_errors():
    from transformer_course.tokens import embedding, embedding_reference

    E = torch.zeros(5, 2)
    for fn in (embedding, embedding_reference):
        with pytest.raises(ValueError, match=r"id 5 is outside the vocabulary: E has 5 rows"):
            fn(torch.tensor([0, 5]), E)
        with pytest.raises(ValueError, match=r"token id -1 is outside"):
            fn(torch.tensor([-1]), E)
        with pytest.raises(TypeError, match=r"integer token ids, got dtype torch.float32"):
            fn(torch.tensor([1.0]), E)
        with pytest.raises(TypeError, match=r"torch.tensor\(ids\)"):
            fn([1, 2], E)
        with pytest.raises(ValueError, match=r"must be 2-D, \(vocab_size, D\)"):
            fn(torch.tensor([1]), torch.zeros(5))


def test_pretokenize_pieces_join_back_and_errors():
    from transformer_course.tokens import pretokenize

    text = "Speak, speak.\n\nFirst Citizen:  You are"
    pieces = pretokenize(text)
    assert "".join(pieces) == text
    assert pieces == [
        "Speak",
        ",",
        " speak",
        ".",
        "\n\n",
        "First",
        " Citizen",
        ":",
        "  ",
        "You",
        " are",
    ]  # a word keeps one leading space; longer runs of whitespace are pieces of their own
    with pytest.raises(TypeError, match="text must be a str"):
        pretokenize(b"bytes")


# ------------------------------------------------------------------------------------------------
# Windows of a time series (1-D patches)
# ------------------------------------------------------------------------------------------------


def test_patchify_1d_by_hand():
    from transformer_course.tokens import patchify_1d

    series = torch.arange(12.0).reshape(1, 2, 6)  # channel 0: 0..5, channel 1: 6..11
    assert patchify_1d(series, 3)[0].tolist() == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]


def test_patchify_1d_equals_strided_conv1d(gen):
    from transformer_course.tokens import patchify_1d

    B, C, T, L, D = 2, 3, 20, 4, 5
    series = torch.randn(B, C, T, generator=gen, dtype=torch.float64)
    S = patchify_1d(series, L)
    assert S.shape == (B, T // L, C * L)
    for n in range(T // L):
        assert torch.equal(S[:, n], series[:, :, n * L : (n + 1) * L].reshape(B, C * L))
    linear = torch.nn.Linear(C * L, D, dtype=torch.float64)
    conv = torch.nn.Conv1d(C, D, kernel_size=L, stride=L, dtype=torch.float64)
    with torch.no_grad():
        conv.weight.copy_(linear.weight.reshape(D, C, L))  # (C, L) order inside a window
        conv.bias.copy_(linear.bias)
    torch.testing.assert_close(linear(S), conv(series).transpose(1, 2), rtol=0, atol=1e-12)


def test_patchify_1d_errors():
    from transformer_course.tokens import patchify_1d

    with pytest.raises(ValueError, match=r"T=10 is not divisible by window=4"):
        patchify_1d(torch.zeros(1, 2, 10), 4)
    with pytest.raises(ValueError, match=r"unsqueeze\(0\)"):
        patchify_1d(torch.zeros(2, 10), 5)
    with pytest.raises(ValueError, match="window must be a positive int"):
        patchify_1d(torch.zeros(1, 2, 10), 0)


def test_overlapping_patches_match_a_loop_and_a_strided_convolution():
    images = torch.randn(3, 2, 8, 8, dtype=torch.float64)
    P, S = 4, 2
    patches = patchify(images, P, stride=S)  # (B, N, C*P*P)
    assert patches.shape == (3, 16, 2 * P * P)
    padded = torch.nn.functional.pad(images, (1, 1, 1, 1))  # (P - S) / 2 zeros on every side
    for n in range(16):
        i, j = divmod(n, 4)  # row-major over the 4 x 4 grid of patches
        window = padded[:, :, S * i : S * i + P, S * j : S * j + P]
        assert torch.equal(patches[:, n], window.reshape(3, -1))
    assert torch.equal(patchify(images, 2, stride=2), patchify(images, 2))  # S = P: the ViT's
    embed = PatchEmbedding(P, 2, 16, stride=S).double()
    conv = embed.as_conv2d()
    assert conv.stride == (S, S) and conv.padding == (1, 1)
    torch.testing.assert_close(conv(images).flatten(2).transpose(1, 2), embed(images))
    with pytest.raises(ValueError, match="P - S even"):
        patchify(images, 4, stride=1)
    with pytest.raises(ValueError, match="stride S <= P"):
        patchify(images, 2, stride=4)
    with pytest.raises(ValueError, match="not divisible by stride=2"):
        patchify(torch.zeros(1, 1, 7, 7), 4, stride=2)


# ------------------------------------------------------------------------------------------------
# Special tokens
# ------------------------------------------------------------------------------------------------

EOT = "<|endoftext|>"


def test_special_tokens_get_ids_after_the_merges_and_are_never_merged():
    text = f"ab{EOT}ab{EOT}{EOT}abab"
    tok = BPETokenizer.train(text, vocab_size=300, special_tokens=[EOT], pattern="course")
    # only "ab" (and then "abab") can be learned: the special token's bytes never take part
    assert tok.merges == [(97, 98), (256, 256)]
    assert tok.special_tokens == {EOT: 258} and tok.vocab_size == 259
    assert tok.encode(text) == [256, 258, 256, 258, 258, 257]
    assert tok.decode(tok.encode(text)) == text
    assert tok.tokens_as_strings(f"x{EOT}y") == ["x", EOT, "y"]
    # the same merges, no special token: it is split into bytes
    plain = BPETokenizer(tok.merges, pattern="course")
    assert plain.encode(EOT) == list(EOT.encode()) and len(plain.encode(EOT)) == 13


def test_special_tokens_round_trip_and_leave_their_neighbours_alone():
    rng = random.Random(3)
    specials = [EOT, "<|end|>", "<|end|>\n"]
    train_text = random_text(rng, 3000)
    tok = BPETokenizer.train(train_text, vocab_size=330, special_tokens=specials, pattern="course")
    plain = BPETokenizer(tok.merges, pattern="course")
    for _ in range(50):
        parts = [random_text(rng, rng.randrange(0, 12)) for _ in range(6)]
        text = "".join(p + rng.choice(specials) for p in parts)
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        expected = []  # each ordinary span encoded on its own, each special token one id
        for span, special in tc.tokens.split_special(text, specials):
            expected += [tok.special_tokens[span]] if special else plain.encode(span)
        assert ids == expected


def test_split_special_longest_first_leftmost_first():
    split = tc.tokens.split_special
    specials = ["<|end|>", "<|end|>\n"]
    assert split("a<|end|>\nb<|end|>c", specials) == [
        ("a", False), ("<|end|>\n", True), ("b", False), ("<|end|>", True), ("c", False)
    ]  # fmt: skip
    assert split("a<|end|>\nb", specials[::-1]) == split("a<|end|>\nb", specials)  # order given
    assert split("abc", ["bc", "ab"]) == [("ab", True), ("c", False)]  # the leftmost starts first
    assert split("", specials) == [] and split("xy", []) == [("xy", False)]


def test_text_holding_only_part_of_a_special_token_is_ordinary():
    tok = BPETokenizer.train(
        "the <|end of it <|endoftext", vocab_size=280, special_tokens=[EOT], pattern="course"
    )
    plain = BPETokenizer(tok.merges, pattern="course")
    for text in ["<|endoftext", "<|endoftext|", "<|", "|>", "x <|endof y", "<|endoftext|"[::-1]]:
        assert tok.encode(text) == plain.encode(text), text
    assert tok.encode("<|endoftext|>x") == [tok.special_tokens[EOT], *plain.encode("x")]


def test_special_token_errors():
    with pytest.raises(ValueError, match="must not be empty"):
        BPETokenizer(special_tokens=[""], pattern="course")
    with pytest.raises(ValueError, match=r"\['<\|a\|>'\] registered twice"):
        BPETokenizer(special_tokens=["<|a|>", "<|b|>", "<|a|>"], pattern="course")
    with pytest.raises(TypeError, match=r"must be a str, got b'<\|a\|>' \(bytes\)"):
        BPETokenizer(special_tokens=[b"<|a|>"], pattern="course")
    with pytest.raises(TypeError, match=r"got the string '<\|a\|>'; write \['<\|a\|>'\]"):
        BPETokenizer(special_tokens="<|a|>", pattern="course")
    with pytest.raises(ValueError, match=r"has id 97, which the token b'a' already has"):
        BPETokenizer(special_tokens={"<|a|>": 97}, pattern="course")
    with pytest.raises(ValueError, match="share an id"):
        BPETokenizer(special_tokens={"<|a|>": 300, "<|b|>": 300}, pattern="course")
    with pytest.raises(ValueError, match=r"vocab_size=256 is too small.*1 special token.*>= 257"):
        BPETokenizer.train("abc", vocab_size=256, special_tokens=[EOT], pattern="course")
    with pytest.raises(TypeError, match="text must be a str"):
        tc.tokens.split_special(b"abc", [EOT])


# ------------------------------------------------------------------------------------------------
# GPT-2's pre-tokenization pattern
# ------------------------------------------------------------------------------------------------


def test_gpt2_pattern_by_hand():
    from transformer_course.tokens import pretokenize

    text = "they're  here, I'll pay 1,000 ducats!!\n\n  x² WE'LL"
    assert pretokenize(text, "gpt2") == [
        "they", "'re", " ", " here", ",", " I", "'ll", " pay", " 1", ",", "000", " ducats", "!!",
        "\n\n ", " x", "²", " WE", "'", "LL",
    ]  # fmt: skip
    assert pretokenize(text) == [  # the course's pattern: no contractions, digits are word chars
        "they", "'", "re", "  ", "here", ",", " I", "'", "ll", " pay", " 1", ",", "000", " ducats",
        "!!", "\n\n  ", "x²", " WE", "'", "LL",
    ]  # fmt: skip
    for pattern in tc.tokens.PATTERNS:
        assert "".join(pretokenize(text, pattern)) == text
    with pytest.raises(ValueError, match=r"pattern='gpt3' is not a pre-tokenization pattern"):
        pretokenize(text, "gpt3")


def _all_code_points() -> str:
    return "".join(map(chr, range(sys.maxunicode + 1)))


def test_gpt2_pattern_classes_equal_the_regex_module_on_every_code_point():
    """\\p{L}, \\p{N} and \\s of the regex module against the course's re classes, code point by
    code point. They may differ only where one of the two Unicode databases (Python's, or the newer
    one regex ships) has not assigned the code point yet."""
    regex = pytest.importorskip("regex")
    from transformer_course.tokens.pretokenize import _WHITE_SPACE, _unicode_class

    everything = _all_code_points()
    assert set(regex.findall(r"\s", everything)) == set(re.findall(f"[{_WHITE_SPACE}]", everything))
    assigned = regex.sub(
        r"\p{Cn}", "", "".join(c for c in everything if unicodedata.category(c) != "Cn")
    )
    assert len(assigned) > 140_000  # every character both databases know
    for theirs, ours in [(r"\p{L}", _unicode_class("L")), (r"\p{N}", _unicode_class("N"))]:
        assert regex.findall(theirs, assigned) == re.findall(f"[{ours}]", assigned), theirs
    # the look-alike [^\W\d_] is not \p{L}: it also takes numbers that are not decimal digits
    assert re.findall(r"[^\W\d_]", "x²½Ⅻ") == ["x", "²", "½", "Ⅻ"]
    assert regex.findall(r"\p{L}", "x²½Ⅻ") == ["x"]


def test_gpt2_pattern_cuts_the_same_pieces_as_the_regex_module():
    regex = pytest.importorskip("regex")
    theirs = regex.compile(tc.tokens.GPT2_REGEX)
    ours = tc.tokens.gpt2_pattern()
    rng = random.Random(4)
    alphabet = ALPHABET + "'srtvmld  \n\n\x1c\x85\u3000\u2028\xa0²½Ⅻ٣-"
    for _ in range(3000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 25)))
        assert ours.findall(s) == theirs.findall(s), repr(s)
    sample = tc.tokens.gpt2_sample().text
    assert ours.findall(sample) == theirs.findall(sample)


# ------------------------------------------------------------------------------------------------
# GPT-2's ranks: the shipped sample, exactly
# ------------------------------------------------------------------------------------------------

R50K_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"  # tiktoken's hash


@pytest.fixture(scope="module")
def sample():
    return tc.tokens.gpt2_sample()


@pytest.fixture(scope="module")
def gpt2(sample):
    return BPETokenizer.from_ranks(sample.ranks, sample.special_tokens, pattern="gpt2")


def test_gpt2_sample_is_encoded_exactly_as_tiktoken_encoded_it(sample, gpt2):
    assert sample.source["ranks_sha256"] == R50K_SHA256  # the published GPT-2 table
    assert sample.special_tokens == {EOT: 50256} and gpt2.vocab_size == 50257
    assert len(sample.ids) > 150 and sample.text.count(EOT) == 3
    assert gpt2.encode(sample.text) == sample.ids
    assert gpt2.decode(sample.ids) == sample.text
    assert list(gpt2.encode_iterable(sample.text.splitlines(keepends=True))) == sample.ids


def test_gpt2_wrong_variants_differ(sample, gpt2):
    course_split = BPETokenizer.from_ranks(sample.ranks, sample.special_tokens, pattern="course")
    as_text = BPETokenizer.from_ranks(
        sample.ranks, pattern="gpt2"
    )  # "<|endoftext|>" not registered
    assert course_split.encode(sample.text) != sample.ids
    assert as_text.encode(EOT) == [27, 91, 437, 1659, 5239, 91, 29]  # <, |, end, of, text, |, >
    assert gpt2.encode(EOT) == [50256]


def test_gpt2_byte_ids_are_a_permutation_not_the_byte_values(sample):
    byte_ids = {t[0]: r for t, r in sample.ranks.items() if len(t) == 1}
    assert sorted(byte_ids.values()) == list(range(256))
    assert byte_ids[ord("!")] == 0 and byte_ids[ord("A")] == 32 and byte_ids[0] == 188
    gpt2 = BPETokenizer.from_ranks(sample.ranks, pattern="gpt2")
    assert gpt2.encode("\x00!") == [188, 0]


def test_the_course_rule_equals_tiktoken_on_random_text(sample, gpt2):
    """The same table in both encoders (the shipped part of GPT-2's): equal ids on any text."""
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding(
        "gpt2-sample",
        pat_str=sample.source["pat_str"],
        mergeable_ranks=sample.ranks,
        special_tokens=sample.special_tokens,
    )
    rng = random.Random(5)
    words = re.split(r"(\s+)", sample.text)
    alphabet = ALPHABET + "'srtvmld<|>  \n\x1c\x85\u3000²½"
    for trial in range(1500):
        if trial % 2:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))
        else:
            text = "".join(rng.choice(words) for _ in range(rng.randrange(0, 30)))
        assert gpt2.encode(text) == enc.encode(text, allowed_special="all"), repr(text)


def test_ranks_of_a_trained_tokenizer_encode_like_its_merges():
    """Lowest rank first (tiktoken's rule) = the merges in the order they were learned."""
    rng = random.Random(6)
    tok = BPETokenizer.train(random_text(rng, 4000), vocab_size=400, pattern="course")
    ranks = {token: i for i, token in tok.vocab.items()}
    assert len(ranks) == len(tok.vocab)  # no two tokens share their bytes
    from_ranks = BPETokenizer.from_ranks(ranks, pattern="course")
    for _ in range(100):
        s = random_text(rng, rng.randrange(0, 80))
        assert from_ranks.encode(s) == tok.encode(s)


def test_from_ranks_errors():
    ranks = {bytes([b]): b for b in range(256)}
    with pytest.raises(ValueError, match=r"lacks 1 single byte\(s\)"):
        BPETokenizer.from_ranks({t: r for t, r in ranks.items() if t != b"a"}, pattern="gpt2")
    with pytest.raises(ValueError, match=r"rank 97 is given to both b'a' and b'ab'"):
        BPETokenizer.from_ranks({**ranks, b"ab": 97}, pattern="gpt2")
    with pytest.raises(ValueError, match="empty token"):
        BPETokenizer.from_ranks({**ranks, b"": 300}, pattern="gpt2")
    with pytest.raises(ValueError, match="pattern='GPT-2' is not"):
        BPETokenizer.from_ranks(ranks, pattern="GPT-2")
    tok = BPETokenizer.from_ranks({**ranks, b"ab": 300}, special_tokens=[EOT], pattern="gpt2")
    assert tok.special_tokens == {EOT: 301} and tok.encode("ab" + EOT) == [300, 301]


def test_read_tiktoken_by_hand_and_errors():
    from transformer_course.tokens import read_tiktoken

    assert read_tiktoken("IQ== 0\nIg== 1\n\n") == {b"!": 0, b'"': 1}
    assert read_tiktoken(b"IGE= 7\n") == {b" a": 7}
    with pytest.raises(ValueError, match=r"line 2 of the ranks file is 'Ig=='"):
        read_tiktoken("IQ== 0\nIg==\n")
    with pytest.raises(ValueError, match=r"line 2: the token b'!' is listed twice"):
        read_tiktoken("IQ== 0\nIQ== 1\n")


# ------------------------------------------------------------------------------------------------
# Streaming
# ------------------------------------------------------------------------------------------------


def random_chunks(rng: random.Random, text: str, cuts: Sequence[int] = ()) -> list[str]:
    points = sorted(
        {*cuts, *rng.sample(range(len(text) + 1), min(len(text) + 1, rng.randrange(0, 30)))}
    )
    return [text[a:b] for a, b in pairwise([0, *points, len(text)])]


def cut_points(text: str, specials: list[str]) -> list[int]:
    """Places a chunk boundary is hard on: inside special tokens, runs of whitespace, contractions."""
    inside = [m.start() + 1 + k for m in re.finditer(r"\s{2,}|'\w\w?", text) for k in range(2)]
    for s in specials:
        inside += [
            i + k for i in range(len(text)) if text.startswith(s, i) for k in (1, len(s) - 1)
        ]
    return [i for i in inside if 0 < i < len(text)]


@pytest.mark.parametrize("pattern", ["course", "gpt2"])
def test_encode_iterable_equals_encode_of_the_joined_text(pattern):
    rng = random.Random(7)
    specials = [EOT, "<|end|>", "<|end|>\n"]
    tok = BPETokenizer.train(
        random_text(rng, 3000) + " they're we'll  ", 340, special_tokens=specials, pattern=pattern
    )
    pieces = [" they're", "  ", "\n\n", " x", "é😀", "'ll", "<|end", "<|end|>", *specials, "   a"]
    for _ in range(150):
        text = "".join(
            rng.choice([*pieces, random_text(rng, 5)]) for _ in range(rng.randrange(0, 25))
        )
        expected = tok.encode(text)
        chunks = random_chunks(rng, text, cut_points(text, specials))
        assert list(tok.encode_iterable(chunks)) == expected, chunks
        assert list(tok.encode_iterable(text)) == expected  # one character at a time


def test_encode_iterable_on_the_gpt2_sample_with_every_two_chunk_split(sample, gpt2):
    text = sample.text
    for cut in range(len(text) + 1):
        assert list(gpt2.encode_iterable([text[:cut], text[cut:]])) == sample.ids, cut


@pytest.mark.parametrize("text", ["x're", "x'r", "x'", "we'll go", "x're'", "a  'v"])
def test_encode_iterable_waits_two_characters_after_a_lone_apostrophe(text, gpt2):
    """Whether ``'`` is a piece of its own depends on the two characters after it: ``x'r`` gives
    ``'``, ``x're`` gives ``'re``. Fed one character at a time, the stream must wait for both."""
    assert tc.tokens.pretokenize("x'r", "gpt2") == ["x", "'", "r"]
    assert tc.tokens.pretokenize("x're", "gpt2") == ["x", "'re"]
    assert list(gpt2.encode_iterable(text)) == gpt2.encode(text)


def test_encode_iterable_streams_a_file_and_an_endless_source(tmp_path):
    tok = BPETokenizer.train(
        "to be or not to be, that is the question\n" * 20, 290, [EOT], pattern="course"
    )
    path = tmp_path / "text.txt"
    text = ("to be or not to be" + EOT + "\n") * 300
    path.write_text(text, encoding="utf-8")
    with open(path, encoding="utf-8") as f:
        assert list(tok.encode_iterable(f)) == tok.encode(text)
    read = []

    def endless():
        while True:
            read.append(1)
            yield "that is the question " + EOT

    first = list(itertools.islice(tok.encode_iterable(endless()), 1000))
    assert first == tok.encode("".join(["that is the question " + EOT] * len(read)))[:1000]
    assert len(read) < 200  # ids come out as the lines go in
    with pytest.raises(TypeError, match="open a file in text mode"):
        list(tok.encode_iterable([b"bytes"]))


# ------------------------------------------------------------------------------------------------
# Fast training = the recount
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["course", "gpt2"])
def test_fast_training_learns_the_reference_merges_on_tiny_shakespeare(pattern):
    try:
        text = tc.data.tinyshakespeare_path(download=False).read_text(encoding="utf-8")
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    for start in (0, 400_000, 1_000_000):
        part = text[start : start + 15_000]
        fast = BPETokenizer.train(part, 450, pattern=pattern)
        reference = BPETokenizer.train_reference(part, 450, pattern=pattern)
        assert fast.merges == reference.merges and len(fast.merges) == 450 - 256


ADVERSARIAL = [
    "aaaa",  # (a, a) overlaps itself: counted three times, merged twice
    "aaaaaaa aaaa aaa aa a",
    "abababab babababa",
    "dcba abcd",  # every pair once: ties all the way down
    "aaabdaaabac",
    "zzzz yyyy zzzz yyyy",  # two pairs tie on count; the smaller ids win
    "ab ba ab ba abab baba",
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_fast_training_learns_the_reference_merges_on_adversarial_texts(text):
    for vocab_size in (257, 260, 300):  # 300: until no piece has two tokens left
        fast = BPETokenizer.train(text, vocab_size, pattern="course")
        assert (
            fast.merges == BPETokenizer.train_reference(text, vocab_size, pattern="course").merges
        )


def test_fast_training_equals_the_reference_on_random_words():
    from transformer_course.tokens import train_merges, train_merges_reference

    rng = random.Random(8)
    for _ in range(60):
        words = {
            tuple(rng.choice(b"aab") for _ in range(rng.randrange(1, 9))): rng.randrange(1, 4)
            for _ in range(rng.randrange(1, 12))
        }
        n = rng.randrange(0, 30)
        assert train_merges(words, n) == train_merges_reference(words, n), words
    assert train_merges({(1, 1, 1, 1): 1}, 5) == [(1, 1), (256, 256)]


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = list_exercises("tokens.")


def test_the_lab_has_six_exercises():
    assert NAMES == [
        "tokens.bpe_merge",
        "tokens.char_encode",
        "tokens.count_tokens",
        "tokens.encode_with_special",
        "tokens.one_hot_embed",
        "tokens.patchify",
    ]


@pytest.mark.parametrize("name", NAMES)
def test_stub_reports_not_attempted(name):
    def stub(*args):
        raise NotImplementedError

    assert check(name, stub).status == "not attempted"


# ------------------------------------------------------------------------------------------------
# The solutions agree with the package
# ------------------------------------------------------------------------------------------------


def test_char_encode_matches_char_tokenizer():
    for text in ex_tokens._LINES:
        expected = tc.tokens.CharTokenizer.from_text(text).encode_tensor(text)
        assert torch.equal(ex_tokens.char_encode(text), expected)


def test_one_hot_embed_matches_embedding(gen):
    ids = torch.randint(0, 9, (2, 6), generator=gen)
    E = torch.randn(9, 4, generator=gen, dtype=torch.float64)
    torch.testing.assert_close(ex_tokens.one_hot_embed(ids, E), tc.tokens.embedding(ids, E))


def test_bpe_merge_matches_package_and_wikipedia_example():
    ids = torch.tensor(list(b"aaabdaaabac"))
    got = ex_tokens.bpe_merge(ids, (97, 97), 256)
    assert (
        got.tolist()
        == tc.tokens.merge_pair(ids, (97, 97), 256)
        == [256, 97, 98, 100, 256, 97, 98, 97, 99]
    )
    tok = tc.tokens.BPETokenizer.train("aaabdaaabac", vocab_size=257, pattern="course")
    assert tok.merges == [(97, 97)] and tok.encode("aaabdaaabac") == got.tolist()


def test_patchify_solution_matches_package(gen):
    images = torch.randn(2, 3, 8, 12, generator=gen)
    assert torch.equal(ex_tokens.patchify(images, 4), tc.tokens.patchify(images, 4))


def test_encode_with_special_matches_the_package(gen):
    for trial in range(3):
        text, special_ids, encode = ex_tokens._special_inputs(gen, trial)
        merges = encode.__self__.merges  # the small tokenizer the exercise encodes with
        tok = tc.tokens.BPETokenizer(merges, special_tokens=special_ids, pattern="course")
        assert ex_tokens.encode_with_special(text, special_ids, encode).tolist() == tok.encode(text)
        assert "<|end|>\n" in text and "<|end" in text.replace("<|end|>", "")


@pytest.mark.parametrize(("H", "W", "P", "C"), [(224, 224, 16, 3), (30, 45, 7, 3), (8, 8, 4, 1)])
def test_count_tokens_matches_the_shape_of_cropped_patches(H, W, P, C):
    N, d = ex_tokens.count_tokens(H, W, P, C).tolist()
    cropped = torch.zeros(1, C, (H // P) * P, (W // P) * P)  # leftover edge pixels cropped
    assert tc.tokens.patchify(cropped, P).shape == (1, N, d)


# ------------------------------------------------------------------------------------------------
# What the framework says about mistakes that are not listed
# ------------------------------------------------------------------------------------------------


def test_transposed_embeddings_are_reported_as_a_transpose():
    def transposed(ids, E):
        return ex_tokens.one_hot_embed(ids, E).transpose(1, 2)  # (B, D, N)

    fb = check("tokens.one_hot_embed", transposed)
    assert fb.status == "incorrect" and "off by a transpose" in fb.message


def test_an_unlisted_wrong_length_is_reported_with_both_shapes():
    def unchanged(ids, pair, new_id):
        return ids  # no merge at all

    fb = check("tokens.bpe_merge", unchanged)
    assert fb.status == "incorrect" and "wrong shape: expected (9,), got (11,)" in fb.message


def test_length_changing_mistakes_are_named_not_just_measured():
    ids = torch.tensor(list(b"aaabdaaabac"))
    for name in ("first occurrence", "move past both ids"):
        mistake = next(m for m in tc.exercises._get("tokens.bpe_merge").mistakes if name in m.why)
        assert len(mistake.wrong(ids, (97, 97), 258)) != len(
            ex_tokens.bpe_merge(ids, (97, 97), 258)
        )
        assert mistake.why in check("tokens.bpe_merge", mistake.wrong).message


def test_returning_a_list_of_ids_is_accepted():
    def as_list(text):
        return ex_tokens.char_encode(text).tolist()

    assert check("tokens.char_encode", as_list)
