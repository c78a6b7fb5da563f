"""Tests for transformer_course.tokens: hand-computed cases, round trips and error messages."""

from __future__ import annotations

import random
import re
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


# ------------------------------------------------------------------------------------------------
# BPETokenizer
# ------------------------------------------------------------------------------------------------


def test_bpe_wikipedia_example():
    # aaabdaaabac: "aa" (4 times) -> Z=256; then "Za" and "ab" tie at 2 and the smaller pair,
    # (97, 98) = "ab", wins -> Y=257 (as on Wikipedia); then "ZY" -> X=258, giving "XdXac".
    tok = BPETokenizer.train("aaabdaaabac", vocab_size=259)
    a, b, c, d = 97, 98, 99, 100
    assert tok.merges == [(a, a), (a, b), (256, 257)]
    assert tok.vocab[256] == b"aa" and tok.vocab[257] == b"ab" and tok.vocab[258] == b"aaab"
    assert tok.encode("aaabdaaabac") == [258, d, 258, a, c]
    assert tok.tokens_as_strings("aaabdaaabac") == ["aaab", "d", "aaab", "a", "c"]
    assert tok.vocab_size == 259


def test_bpe_ties_take_the_smallest_pair():
    tok = BPETokenizer.train("dcba", vocab_size=257)  # pairs dc, cb, ba all once
    assert tok.merges == [(ord("b"), ord("a"))]


def test_bpe_256_is_plain_bytes_and_stops_early():
    text = "naïve café 😀"
    tok = BPETokenizer.train(text, vocab_size=256)
    assert tok.merges == [] and tok.encode(text) == list(text.encode("utf-8"))
    short = BPETokenizer.train("ab", vocab_size=1000)  # only one pair ever exists
    assert short.merges == [(97, 98)] and short.vocab_size == 257


def test_bpe_vocab_size_too_small():
    with pytest.raises(ValueError, match=r"vocab_size=100 is too small.*256 byte values"):
        BPETokenizer.train("hello", vocab_size=100)


def test_bpe_round_trip_random_unicode():
    rng = random.Random(1)
    tok = BPETokenizer.train(random_text(rng, 3000), vocab_size=320)
    assert tok.vocab_size == 320
    for _ in range(50):
        s = random_text(rng, rng.randrange(0, 60))
        assert tok.decode(tok.encode(s)) == s
    unseen = "Ωμέγα ∑ \x00 \U0010ffff"  # characters never seen in training still round-trip
    assert tok.decode(tok.encode(unseen)) == unseen


def test_bpe_encode_matches_merges_applied_in_order():
    """Encoding equals the textbook procedure: run through every merge in order, over each piece."""
    rng = random.Random(2)
    tok = BPETokenizer.train(random_text(rng, 2000), vocab_size=300)

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
    tok = BPETokenizer.train(text, vocab_size=290)
    for k, (a, b) in enumerate(tok.merges):
        assert tok.vocab[256 + k] == tok.vocab[a] + tok.vocab[b]
    assert tok.tokens_as_strings(" evaluation") == [" evaluation"]  # frequent word -> one token
    assert len(tok.encode(text)) < len(text.encode("utf-8")) // 5


def test_bpe_tokens_as_strings_shows_partial_bytes():
    tok = BPETokenizer.train("abc", vocab_size=256)
    assert tok.tokens_as_strings("é") == ["\\xc3", "\\xa9"]
    assert tok.decode([0xC3]) == "\ufffd"  # half a character decodes to the replacement mark


def test_bpe_decode_unknown_id():
    tok = BPETokenizer.train("aaaa", vocab_size=257)
    with pytest.raises(ValueError, match=r"id 257 is not a token id: valid ids are 0 to 256"):
        tok.decode([97, 257])


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
    with pytest.raises(ValueError, match=r"need \(B, N, C\*P\*P\) = \(B, 6, 12\)"):
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
    with pytest.raises(ValueError, match=r"C=3 channels but this PatchEmbedding .* channels=1"):
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
    tok = BPETokenizer.train(text, vocab_size=257)
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


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = list_exercises("tokens.")


def test_the_lab_has_five_exercises():
    assert NAMES == [
        "tokens.bpe_merge",
        "tokens.char_encode",
        "tokens.count_tokens",
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
    tok = tc.tokens.BPETokenizer.train("aaabdaaabac", vocab_size=257)
    assert tok.merges == [(97, 97)] and tok.encode("aaabdaaabac") == got.tolist()


def test_patchify_solution_matches_package(gen):
    images = torch.randn(2, 3, 8, 12, generator=gen)
    assert torch.equal(ex_tokens.patchify(images, 4), tc.tokens.patchify(images, 4))


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
