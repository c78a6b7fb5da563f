"""Chapter *Encoder-decoder*: cross-attention, the decoder, masking and padding, cached decoding, the
recipe, beam search, the small exercises (the lab's model parts: ``test_encoder_decoder_lab.py``)."""

from __future__ import annotations

import pytest
import torch

import transformer_course as tc
from transformer_course.data import DateTask
from transformer_course.encoder_decoder import (
    DATES_RECIPE,
    CrossAttention,
    DecoderBlock,
    Seq2Seq,
    Seq2SeqConfig,
    decoder_mask,
    exact_match,
    train_dates,
)
from transformer_course.exercises import encoder_decoder as ee
from transformer_course.multihead import SelfAttention, multi_head_attention_reference
from transformer_course.train import TrainConfig, train

# ----------------------------------------------------------------------------------------------
# The model

TASK = DateTask()


def small_seq2seq(seed=0):
    torch.manual_seed(seed)
    cfg = Seq2SeqConfig(
        TASK.vocab_size, TASK.vocab_size, TASK.src_len, TASK.tgt_len, d_model=32, H=2
    )
    return Seq2Seq(cfg).eval()


def test_decoder_cannot_see_the_future():
    model = small_seq2seq()
    src, tgt = TASK.tensors(TASK.sample(3, seed=1))
    with torch.no_grad():
        logits = model(src, tgt[:, :-1])[0]
        changed = tgt[:, :-1].clone()
        changed[:, 6:] = 5
        other = model(src, changed)[0]
    torch.testing.assert_close(other[:, :6], logits[:, :6])
    assert not torch.allclose(other[:, 6:], logits[:, 6:])


def test_padding_in_the_source_is_invisible():
    model = small_seq2seq()
    src, tgt = TASK.tensors(TASK.sample(4, seed=2))
    noisy = src.clone()
    noisy[src == TASK.PAD] = (
        7  # change only padded positions ... then tell the model they are padding
    )
    with torch.no_grad():
        memory, keep = model.encode(src)
        a = model.decode(tgt[:, :-1], model.decoder.memory_kv(memory), keep)
        memory2, _ = model.encode(noisy)  # its own mask would now treat 7 as a token
    assert not torch.equal(keep, noisy != TASK.PAD)
    # with the original key mask, encoder outputs at real positions ignore the padded keys entirely
    with torch.no_grad():
        mask = keep[:, None, :].expand(-1, src.shape[1], -1)
        H = model.encoder(model.src_pos(model.src_emb(noisy)), mask)
        b = model.decode(tgt[:, :-1], model.decoder.memory_kv(H), keep)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert memory2.shape == memory.shape


def test_decode_is_the_vocabulary_head_on_the_normalised_decoder_output():
    """eq-ed-head: decode = LN(X^(L_d)) W_vocab, with the memory's keys and values computed once."""
    torch.manual_seed(1)
    cfg = Seq2SeqConfig(
        TASK.vocab_size, TASK.vocab_size, TASK.src_len, TASK.tgt_len, d_model=16, H=2
    )
    model = Seq2Seq(cfg).double().eval()
    src, tgt = TASK.tensors(TASK.sample(3, seed=5))
    with torch.no_grad():
        memory, keep = model.encode(src)
        kv = model.decoder.memory_kv(memory)
        logits = model.decode(tgt[:, :-1], kv, keep)
        X = model.tgt_pos(model.tgt_emb(tgt[:, :-1]))
        for block, kv_m in zip(model.decoder.blocks, kv, strict=True):
            X = block(X, kv_m, keep[:, None, :].expand(-1, X.shape[1], -1))
        expected = model.decoder.final_norm(X) @ model.head.weight.T
    torch.testing.assert_close(logits, expected, atol=1e-12, rtol=0)
    assert not torch.allclose(logits, X @ model.head.weight.T)  # the final LayerNorm matters


def test_decoder_mask_is_causal_and_hides_padded_keys():
    """eq-ed-decmask written out, the exercise's solution, and what a causal layer combines."""
    tokens = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 2, 0, 0]])
    mask = decoder_mask(tokens, 0)
    for b in range(2):
        for n in range(5):
            for m in range(5):
                assert bool(mask[b, n, m]) == (m <= n and int(tokens[b, m]) != 0)
    assert torch.equal(mask, ee.causal_padding_mask.__wrapped__(tokens, 0))
    causal = SelfAttention(8, 2, causal=True).double().eval()
    plain = SelfAttention(8, 2).double().eval()
    plain.load_state_dict(causal.state_dict())
    X = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(
            plain(X, mask), causal(X, (tokens != 0)[:, None, :].expand(-1, 5, -1))
        )


def test_cached_decoding_equals_uncached():
    model = small_seq2seq(3)
    src, _ = TASK.tensors(TASK.sample(5, seed=3))
    a = model.greedy_decode(src, TASK.BOS, TASK.EOS, use_cache=True)
    b = model.greedy_decode(src, TASK.BOS, TASK.EOS, use_cache=False)
    assert torch.equal(a, b) and a.shape == (5, TASK.tgt_len)


def test_seq2seq_learns_and_rejects_long_input():
    model = small_seq2seq(4).train()
    src, tgt = TASK.tensors(TASK.sample(512, seed=4))

    def batch(g):
        i = torch.randint(0, 512, (64,), generator=g)
        return src[i], tgt[i]

    def loss_fn(m, b):
        return m(b[0], b[1][:, :-1], b[1][:, 1:])[1]

    before = loss_fn(model, (src[:128], tgt[:128])).item()
    train(model, batch, loss_fn, TrainConfig(max_steps=40, lr=3e-3, warmup_steps=5), progress=False)
    after = loss_fn(model.eval(), (src[:128], tgt[:128])).item()
    assert after < before - 1.0, (before, after)
    with pytest.raises(ValueError, match="at most 30"):
        model.encode(torch.ones(1, 31, dtype=torch.long))


def test_cross_attention_equals_torch_with_another_sequence_as_keys_and_values():
    g = torch.Generator().manual_seed(5)
    B, N, M, D, H = 2, 4, 7, 12, 3
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    keep = torch.rand(B, M, generator=g) > 0.3
    keep[:, 0] = True
    torch_mha = torch.nn.MultiheadAttention(D, H, batch_first=True).double()
    cross = CrossAttention(D, H).double().load_from_torch(torch_mha)
    mask = keep[:, None, :].expand(-1, N, -1)
    with torch.no_grad():
        ours = cross(X, cross.memory_kv(memory), mask)
        theirs = torch_mha(X, memory, memory, key_padding_mask=~keep, need_weights=False)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    W = cross.weights  # and the concat-form reference with Z = memory (biases set to zero)
    for p in (cross.in_proj.bias, cross.out_proj.bias):
        torch.nn.init.zeros_(p)
    ref = multi_head_attention_reference(X, *W.values(), H, mask=mask, Z=memory)
    with torch.no_grad():
        torch.testing.assert_close(cross(X, cross.memory_kv(memory), mask), ref, atol=1e-12, rtol=0)


def test_causal_cross_attention_cannot_be_built_or_called():
    """The old layer ran causal *cross*-attention silently when N == M; now no call can ask for it."""
    with pytest.raises(TypeError, match="causal"):
        CrossAttention(8, 2, causal=True)
    cross = CrossAttention(8, 2)
    X = torch.randn(1, 5, 8)
    kv = cross.memory_kv(torch.randn(1, 5, 8))  # N == M, the case that used to go wrong silently
    with pytest.raises(TypeError, match="causal"):
        cross(X, kv, causal=True)
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        SelfAttention(8, 2, causal=True)(X, torch.randn(1, 5, 8))  # a second sequence is no mask


def test_memory_keys_and_values_are_computed_once_per_source():
    model = small_seq2seq(6)
    src, _ = TASK.tensors(TASK.sample(3, seed=6))
    calls = []
    for block in model.decoder.blocks:
        block.cross_attn.memory_kv = (lambda f: lambda m: calls.append(1) or f(m))(
            block.cross_attn.memory_kv
        )
    out = model.greedy_decode(src, TASK.BOS, TASK.EOS)
    assert (out[:, 1:] != TASK.PAD).sum() > len(src)  # several decoding steps ran
    assert len(calls) == len(model.decoder.blocks)  # once per block, not once per step


def test_the_recipe_learns_dates():
    run = train_dates(DATES_RECIPE, steps=60)
    assert run.history.steps_done == 60 and run.history.train_loss[-1] < 1.5
    pairs = run.task.held_out(50, exclude=run.train_pairs)
    assert 0.0 <= exact_match(run.model, run.task, pairs) <= 1.0


# ----------------------------------------------------------------------------------------------
# Exercises

NAMES = [
    "encoder_decoder.shift_targets",
    "encoder_decoder.key_padding_mask",
    "encoder_decoder.attention",
    "encoder_decoder.causal_padding_mask",
    "encoder_decoder.beam_scores",
    "encoder_decoder.decoder_block",
    "encoder_decoder.decode",
    "encoder_decoder.train_step",
    "encoder_decoder.greedy_decode",
]


def test_all_exercises_are_registered():
    assert tc.exercises.list_exercises("encoder_decoder.") == sorted(NAMES)


@pytest.mark.parametrize(
    "name", ["encoder_decoder.key_padding_mask", "encoder_decoder.causal_padding_mask"]
)
def test_masks_are_accepted_as_bool_and_unknown_wrong_masks_are_explained(name):
    ex = tc.exercises._get(name)
    bool_solution = ex.solution.__wrapped__
    args = ex.make_inputs(torch.Generator().manual_seed(0), 0)
    assert bool_solution(*args).dtype == torch.bool
    assert tc.exercises.check(name, bool_solution)
    assert tc.exercises.check(name, lambda *a: bool_solution(*a).long())  # 0/1 integers are fine

    def all_true(tokens, pad_id):  # wrong in a way no listed mistake describes
        B, N = tokens.shape
        return torch.ones(B, N, N, dtype=torch.bool)

    feedback = tc.exercises.check(name, all_true)
    assert feedback.status == "incorrect" and "values differ" in feedback.message


def test_solution_prints_the_bool_function():
    text = tc.exercises.solution("encoder_decoder.key_padding_mask")
    assert text.startswith("def key_padding_mask") and "expand" in text
    assert "as_float" not in text


def test_shift_matches_the_date_task_slices():
    task = DateTask()
    _, tgt = task.tensors(task.sample(6, seed=0))  # (B, tgt_len) = [BOS, y, EOS]
    y = tgt[:, 1:]
    tgt_in, tgt_out = ee.shift_targets(y, task.BOS)
    assert torch.equal(tgt_in, tgt[:, :-1]) and torch.equal(tgt_out, tgt[:, 1:])


def test_key_padding_mask_is_the_mask_the_encoder_uses():
    task = DateTask()
    src, _ = task.tensors(task.sample(5, seed=1))
    torch.manual_seed(0)
    model = Seq2Seq(
        Seq2SeqConfig(task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, d_model=16, H=2)
    ).eval()
    mask = ee.key_padding_mask.__wrapped__(src, task.PAD)
    _, keep = model.encode(src)
    assert torch.equal(mask, keep[:, None, :].expand_as(mask))
    with torch.no_grad():  # the first encoder block, run with the exercise's mask
        H0 = model.src_pos(model.src_emb(src))
        torch.testing.assert_close(
            model.encoder.blocks[0](H0, mask),
            model.encoder.blocks[0](H0, keep[:, None, :].expand(-1, src.shape[1], -1)),
        )


@pytest.mark.parametrize(
    "name", ["encoder_decoder.key_padding_mask", "encoder_decoder.causal_padding_mask"]
)
def test_the_mask_exercises_mistakes_differ_from_the_solution_on_every_trial(name):
    """As tests/test_exercises.py proves for plain exercises (the two mask exercises compare an answer
    broadcast to the mask's shape, so that one skips them)."""
    ex = tc.exercises._get(name)
    for trial in range(ex.trials):
        args = ex.make_inputs(torch.Generator().manual_seed(1000 + trial), trial)
        expected = ex.solution(*args)
        for mistake in ex.mistakes:
            got = torch.as_tensor(mistake.wrong(*args)).to(expected.dtype)
            assert got.shape != expected.shape or not torch.allclose(got, expected), mistake.why
            assert tc.exercises.check(name, mistake.wrong).message.startswith(mistake.why)


def test_the_key_mask_that_broadcasts_over_the_queries_is_accepted():
    """``keep[:, None, :]``, (B, 1, M), is what the from-scratch file's encode builds: accepted; a mask
    of the queries, (B, M, 1), broadcasts too but is named as the mistake it is."""
    name = "encoder_decoder.key_padding_mask"
    assert tc.exercises.check(name, lambda src, pad: (src != pad)[:, None, :])
    feedback = tc.exercises.check(name, lambda src, pad: (src != pad)[:, :, None])
    assert feedback.status == "incorrect" and "masked the queries" in feedback.message
    feedback = tc.exercises.check(name, lambda src, pad: (src != pad)[:, None, None, :])
    assert feedback.status == "incorrect" and "wrong shape" in feedback.message


def test_a_shift_sliced_as_the_chapter_slices_is_explained():
    """The chapter slices DateTask's targets, which begin with BOS; the exercise's y does not, and the
    slices of y (one column short) are named, not reported as a bare shape error."""
    feedback = tc.exercises.check(
        "encoder_decoder.shift_targets", lambda y, bos: torch.stack([y[:, :-1], y[:, 1:]])
    )
    assert feedback.status == "incorrect" and "begin with BOS" in feedback.message


def test_hiding_the_padded_queries_too_is_named_with_the_nan_it_causes():
    def both(tokens, pad_id):
        keep = tokens != pad_id
        return ee.causal_padding_mask.__wrapped__(tokens, pad_id) & keep[:, :, None]

    feedback = tc.exercises.check("encoder_decoder.causal_padding_mask", both)
    assert feedback.status == "incorrect" and "NaN" in feedback.message


@pytest.mark.parametrize(
    ("where", "phrase"),
    [
        ("both", "both the sum and the length"),
        ("length", "out of the length"),
        ("sum", "of the sum"),
    ],
)
def test_eos_left_out_of_the_sum_the_length_or_both_is_named_as_such(where, phrase):
    feedback = tc.exercises.check(
        "encoder_decoder.beam_scores", lambda t, lp, a: ee._score_without_eos(t, lp, a, where)
    )
    assert feedback.status == "incorrect" and phrase in feedback.message, feedback.message


def test_the_mean_log_probability_is_named_not_left_as_a_difference():
    def mean(tokens, log_probs, alpha):
        real = tokens[:, 1:] != TASK.PAD
        return (log_probs * real).sum(1) / real.sum(1)

    feedback = tc.exercises.check("encoder_decoder.beam_scores", mean)
    assert feedback.status == "incorrect" and "mean log-probability" in feedback.message


def test_causal_padding_mask_is_what_multihead_attention_combines():
    g = torch.Generator().manual_seed(4)
    tokens = torch.tensor([[0, 0, 5, 6, 7], [3, 4, 5, 0, 0]])
    mask = ee.causal_padding_mask.__wrapped__(tokens, 0)
    expected = torch.tensor(
        [
            [[0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]],
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    causal = SelfAttention(8, 2, causal=True).double().eval()
    plain = SelfAttention(8, 2).double().eval()
    plain.load_state_dict(causal.state_dict())
    X = torch.randn(2, 5, 8, generator=g, dtype=torch.float64)
    key_mask = (tokens != 0)[:, None, :].expand(-1, 5, -1)
    with torch.no_grad():  # a causal layer combines a key mask with the causal mask by &
        torch.testing.assert_close(plain(X, mask), causal(X, key_mask))


def test_decoder_block_equals_torchs_pre_norm_decoder_layer():
    """eq-ed-decoder against ``torch.nn.TransformerDecoderLayer(norm_first=True)`` with the same weights;
    a post-norm block, a cross-attention fed LN(X) instead of LN(Z_1), or a missing mask would differ."""
    g = torch.Generator().manual_seed(6)
    B, N, M, D, H = 2, 5, 7, 16, 4
    block = DecoderBlock(D, H).double().eval()
    with torch.no_grad():  # LayerNorm scales and biases away from 1 and 0 as well
        for p in block.parameters():
            p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    ref = (
        torch.nn.TransformerDecoderLayer(
            D, H, 4 * D, dropout=0.0, batch_first=True, norm_first=True
        )
        .double()
        .eval()
    )
    ref.self_attn = block.self_attn.to_torch()
    ref.multihead_attn = block.cross_attn.to_torch()
    ref.linear1, ref.linear2 = block.mlp.fc1, block.mlp.fc2
    for mine, theirs in zip(
        (block.norm1, block.norm2, block.norm3), (ref.norm1, ref.norm2, ref.norm3), strict=True
    ):
        theirs.weight, theirs.bias = mine.weight, mine.bias
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[1, 4:] = False  # the second source has 3 padded tokens
    with torch.no_grad():
        ours = block(X, block.cross_attn.memory_kv(memory), keep[:, None, :].expand(B, N, M))
        theirs = ref(
            X, memory, tgt_mask=~tc.self_attention.causal_mask(N), memory_key_padding_mask=~keep
        )
    torch.testing.assert_close(ours, theirs, atol=1e-10, rtol=0)


def test_cross_attention_map_and_its_head_mean_equal_torchs_weights():
    """attention_map is every head's A^(h) (against torch's per-head weights), and its mean over the
    heads is the alignment of eq-ed-align (against torch's averaged weights)."""
    g = torch.Generator().manual_seed(7)
    B, N, M, D, H = 2, 4, 6, 12, 3
    cross = CrossAttention(D, H).double()
    torch_mha = cross.to_torch()
    X = torch.randn(B, N, D, generator=g, dtype=torch.float64)
    memory = torch.randn(B, M, D, generator=g, dtype=torch.float64)
    keep = torch.ones(B, M, dtype=torch.bool)
    keep[0, -2:] = False
    with torch.no_grad():
        A = cross.attention_map(X, cross.memory_kv(memory), keep[:, None, :].expand(B, N, M))
        kw = {"key_padding_mask": ~keep, "need_weights": True}
        per_head = torch_mha(X, memory, memory, average_attn_weights=False, **kw)[1]
        mean = torch_mha(X, memory, memory, average_attn_weights=True, **kw)[1]
    assert A.shape == (B, H, N, M)
    torch.testing.assert_close(A, per_head, atol=1e-12, rtol=0)
    torch.testing.assert_close(A.mean(dim=1), mean, atol=1e-12, rtol=0)
    assert torch.all(A[0, :, :, -2:] == 0)  # padded source tokens get no weight


def test_greedy_decode_takes_the_argmax_at_every_step_and_pads_after_eos():
    """eq-ed-greedy by recomputing the whole prefix at every step; a decoder that took the argmax at
    the wrong position, kept writing after EOS or fed back the wrong token would differ."""
    torch.manual_seed(8)
    config = Seq2SeqConfig(
        TASK.vocab_size, TASK.vocab_size, TASK.src_len, TASK.tgt_len, d_model=32, H=2
    )
    model = Seq2Seq(config).eval()
    src, _ = TASK.tensors(TASK.sample(6, seed=8))
    out = model.greedy_decode(src, TASK.BOS, TASK.EOS)
    with torch.no_grad():
        for b in range(len(src)):
            prefix = [TASK.BOS]
            while len(prefix) < TASK.tgt_len and prefix[-1] != TASK.EOS:
                logits = model(src[b : b + 1], torch.tensor([prefix]))[0]
                prefix.append(int(logits[0, -1].argmax()))
            expected = prefix + [TASK.PAD] * (TASK.tgt_len - len(prefix))
            assert out[b].tolist() == expected, b


@pytest.fixture
def one_thread():
    """Tiny models run fastest on one thread, most of all on a busy CPU (as the checker runs them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ----------------------------------------------------------------------------------------------
# Beam search with length normalisation


def tiny_seq2seq(seed=0, tgt_vocab=5, tgt_len=6):
    """A seeded untrained model with a tiny target vocabulary (PAD, BOS, EOS and two more), whose
    head and source embeddings are scaled up so that its next-token distributions are far from
    uniform and depend on the source."""
    torch.manual_seed(seed)
    model = Seq2Seq(Seq2SeqConfig(12, tgt_vocab, 7, tgt_len, d_model=16, H=2)).double().eval()
    with torch.no_grad():
        model.head.weight.mul_(10)
        model.src_emb.weight.mul_(10)
    return model


def tiny_sources(n=6):
    src = torch.randint(3, 12, (n, 7), generator=torch.Generator().manual_seed(0))
    src[1, 4:] = 0  # one padded source
    return src


def every_output(vocab, max_len, eos=2):
    """How many outputs of at most max_len tokens exist: the leaves of the generation tree."""
    return (
        sum((vocab - 1) ** (t - 1) for t in range(1, max_len))
        + (vocab - 1) ** (max_len - 1) * vocab
    )


@pytest.mark.parametrize("seed", [0, 2, 3])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_a_beam_as_wide_as_every_output_is_exhaustive_search(one_thread, seed, alpha):
    model, src = tiny_seq2seq(seed), tiny_sources()
    k = every_output(5, 4)
    assert k == 341
    tokens, score = tc.encoder_decoder.beam_search(model, src, k, 4, alpha)
    best, best_score = tc.encoder_decoder.exhaustive_search(model, src, 4, alpha)
    assert torch.equal(tokens, best)
    torch.testing.assert_close(score, best_score, atol=1e-10, rtol=0)


def test_a_narrow_beam_never_beats_exhaustive_search_and_can_miss_its_optimum(one_thread):
    model, src = tiny_seq2seq(0), tiny_sources()
    best, best_score = tc.encoder_decoder.exhaustive_search(model, src, 4, 0.6)
    missed = False
    for k in (1, 2, 3, 8):
        tokens, score = tc.encoder_decoder.beam_search(model, src, k, 4, 0.6)
        assert (score <= best_score + 1e-12).all()
        missed |= not torch.equal(tokens, best)
    assert missed  # the test would show nothing on a model where every beam finds the optimum


@pytest.mark.parametrize("tiny", [True, False])
def test_a_beam_of_one_is_greedy_decoding(one_thread, tiny):
    if tiny:
        model, src = tiny_seq2seq(2), tiny_sources()
    else:  # the date task's vocabulary, outputs of varying length
        torch.manual_seed(7)
        model = (
            Seq2Seq(
                Seq2SeqConfig(TASK.vocab_size, TASK.vocab_size, TASK.src_len, TASK.tgt_len, 32, 4)
            )
            .double()
            .eval()
        )
        src = TASK.tensors(TASK.sample(16, seed=4))[0]
    tokens, score = tc.encoder_decoder.beam_search(model, src, 1, model.config.tgt_len - 1)
    assert torch.equal(tokens, model.greedy_decode(src, TASK.BOS, TASK.EOS))
    assert torch.isfinite(score).all() and (score <= 0).all()


def test_beam_search_of_a_batch_equals_one_source_at_a_time(one_thread):
    model, src = tiny_seq2seq(3), tiny_sources()
    tokens, score = tc.encoder_decoder.beam_search(model, src, 3, 5, 0.6)
    for b in range(len(src)):
        one, one_score = tc.encoder_decoder.beam_search(model, src[b : b + 1], 3, 5, 0.6)
        assert torch.equal(one[0], tokens[b])
        torch.testing.assert_close(one_score[0], score[b], atol=1e-12, rtol=0)


def log_p_of(model, src, tokens):
    """log p(y | x) of each chosen output by teacher forcing: the sum over its real tokens."""
    with torch.no_grad():
        logits = model(src, tokens[:, :-1])[0]
    lp = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    real = torch.ones_like(tokens[:, 1:], dtype=torch.bool)
    for b, row in enumerate(tokens.tolist()):  # the tokens up to and including the first EOS
        end = row.index(TASK.EOS) if TASK.EOS in row else len(row) - 1
        real[b, end:] = False
    return (lp * real).sum(-1), real.sum(-1).double()


def test_length_normalisation_changes_the_winner(one_thread):
    """On seed 3 the unnormalised optimum is the shortest output, [EOS]; with alpha = 2 a longer one
    wins. Each winner has the higher log p or the higher normalised score, as its rule says."""
    model, src = tiny_seq2seq(3), tiny_sources()
    ed = tc.encoder_decoder
    plain, plain_score = ed.exhaustive_search(model, src, 4, alpha=0.0)
    normed, normed_score = ed.exhaustive_search(model, src, 4, alpha=2.0)
    changed = (plain != normed).any(dim=1)
    assert changed.sum() >= 2
    lp_plain, len_plain = log_p_of(model, src, plain)
    lp_normed, len_normed = log_p_of(model, src, normed)
    torch.testing.assert_close(plain_score, lp_plain, atol=1e-10, rtol=0)
    assert (len_normed[changed] > len_plain[changed]).all()
    assert (lp_plain[changed] > lp_normed[changed]).all()  # alpha = 0 prefers the likelier one
    by_wu = lambda lp, n: lp / ((5 + n) / 6) ** 2.0  # noqa: E731
    torch.testing.assert_close(normed_score, by_wu(lp_normed, len_normed), atol=1e-10, rtol=0)
    assert (by_wu(lp_normed, len_normed)[changed] > by_wu(lp_plain, len_plain)[changed]).all()
    for k, alpha, expected in ((341, 0.0, plain), (341, 2.0, normed)):
        assert torch.equal(ed.beam_search(model, src, k, 4, alpha)[0], expected)


def test_the_length_penalty_is_wus():
    lp = tc.encoder_decoder.length_penalty(torch.tensor([1.0, 7.0, 13.0]), 0.5)
    torch.testing.assert_close(lp, torch.tensor([1.0, 2.0**0.5, 3.0**0.5]))
    assert tc.encoder_decoder.length_penalty(torch.tensor(9.0), 0.0) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beam_size": 0}, "beam_size must be a positive int"),
        ({"beam_size": 2.0}, "beam_size must be a positive int"),
        ({"beam_size": True}, "beam_size must be a positive int"),
        ({"max_len": 0}, r"max_len .* \[1, 5\]"),
        ({"max_len": 6}, r"tgt_len - 1"),
        ({"alpha": -0.5}, "alpha must be a finite number >= 0"),
        ({"alpha": float("nan")}, "alpha must be a finite number >= 0"),
        ({"alpha": float("inf")}, "alpha must be a finite number >= 0"),
    ],
)
def test_beam_search_rejects_bad_arguments_clearly(kwargs, message):
    model, src = tiny_seq2seq(0), tiny_sources(2)
    args = {"beam_size": 2, "max_len": 4, "alpha": 0.6} | kwargs
    with pytest.raises(ValueError, match=message):
        tc.encoder_decoder.beam_search(model, src, **args)
    with pytest.raises(ValueError, match="src must be"):
        tc.encoder_decoder.beam_search(model, src[0], 2, 4)


def test_the_beam_scores_exercise_is_the_package_s_score(one_thread):
    """The exercise's solution, fed the log-probabilities of the outputs the package's beam search
    chose (with junk at the padded positions), gives the scores beam_search returns."""
    model, src = tiny_seq2seq(3), tiny_sources()
    tokens, score = tc.encoder_decoder.beam_search(model, src, 4, 5, 0.6)
    with torch.no_grad():
        logits = model(src, tokens[:, :-1])[0]
    log_probs = torch.log_softmax(logits, -1).gather(-1, tokens[:, 1:, None])[..., 0]
    ours = [  # rows with no PAD generated before EOS (the exercise reads PAD as padding)
        b for b, row in enumerate(tokens.tolist()) if TASK.PAD not in row[1 : row.index(TASK.EOS)]
    ]
    assert len(ours) >= 3
    got = ee.beam_scores(tokens[ours], log_probs[ours], 0.6)
    torch.testing.assert_close(got, score[ours], atol=1e-10, rtol=0)
