"""Lab 8's model parts: the checkers of the attention class, the decoder block's forward, the decoder's
forward pass, the training step and greedy decoding (``encoder_decoder.attention``,
``.decoder_block``, ``.decode``, ``.train_step``, ``.greedy_decode``) accept the reference solutions,
which are ``scratch/seq2seq.py``'s (imported, not copied) and learners' other correct answers, and
name each typical mistake by its ``why``; the mistakes are planted here one by one. The lab's model
built from the parts, and its training on dates, is the chapter's run when the parts are the
references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import transformer_course as tc
from transformer_course.exercises import check
from transformer_course.exercises import encoder_decoder as ee
from transformer_course.scratch import seq2seq as scratch

PARTS = [
    "encoder_decoder.attention",
    "encoder_decoder.decoder_block",
    "encoder_decoder.decode",
    "encoder_decoder.train_step",
    "encoder_decoder.greedy_decode",
]
MISTAKES = [
    pytest.param(name, k, id=f"{name.split('.')[1]}-{k}")
    for name in PARTS
    for k in range(len(tc.exercises._get(name).mistakes))
]


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models run fastest on one thread, most of all on a busy CPU (as the checkers run them)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_reference_solutions_are_the_scratch_file_imported_not_copied():
    assert tc.exercises._get("encoder_decoder.attention").solution is scratch.MultiHeadAttention
    assert tc.exercises._get("encoder_decoder.decode").solution is scratch.Seq2Seq
    assert tc.exercises._get("encoder_decoder.decoder_block").solution is scratch.DecoderBlock
    assert tc.exercises._get("encoder_decoder.greedy_decode").solution is scratch.greedy_decode
    assert ee.DecoderBlock is scratch.DecoderBlock and ee.greedy_decode is scratch.greedy_decode
    assert tc.exercises._get("encoder_decoder.train_step").solution is ee.train_step


@pytest.mark.parametrize("name", PARTS)
def test_the_reference_solution_passes(name):
    feedback = check(name, tc.exercises._get(name).solution)
    assert feedback.status == "correct", str(feedback)


@pytest.mark.parametrize("name", PARTS)
def test_each_checker_knows_at_least_five_typical_mistakes(name):
    mistakes = tc.exercises._get(name).mistakes
    assert len(mistakes) >= 5
    assert len({m.why for m in mistakes}) == len(mistakes), "two mistakes with one explanation"


@pytest.mark.parametrize(("name", "k"), MISTAKES)
def test_each_typical_mistake_is_named(name, k):
    mistake = tc.exercises._get(name).mistakes[k]
    feedback = check(name, mistake.wrong)
    assert feedback.status == "incorrect", str(feedback)
    assert mistake.why in feedback.message, (mistake.why, feedback.message)


@pytest.mark.parametrize("name", PARTS)
def test_each_mistake_shows_on_a_case_and_is_the_one_named_there(name):
    """The checker stops at the first case where an answer differs from the package and names the first
    mistake that gives the same result there. So each mistake must differ on some case, clearly (or
    fail as it declares: raise, give NaN, change the shape), and on the first such case no mistake
    listed before it may give the same result: the one named is the one made. (A mistake may agree with
    the package on an earlier case: keys and values taken from X are right in self-attention.)"""
    ex = tc.exercises._get(name)
    cases = ex.cases()
    expected = [ex.expected(case) for case in cases]
    outcomes = [[ee._outcome(ex.observe, m.wrong, case) for case in cases] for m in ex.mistakes]
    for k, mistake in enumerate(ex.mistakes):
        differs = [
            i
            for i, (got, exp) in enumerate(zip(outcomes[k], expected, strict=True))
            if isinstance(got, Exception) or not ee._same(got, exp, ex.atol, ex.rtol)
        ]
        assert differs, f"no case shows the mistake: {mistake.why}"
        i = differs[0]
        wrong = outcomes[k][i]
        if isinstance(wrong, Exception):
            assert mistake.fails_by == "raises", (mistake.why, wrong)
        else:
            values = list(wrong.values())
            if mistake.fails_by == "nan":
                assert any(torch.isnan(v).any() for v in values if v.is_floating_point())
            elif mistake.fails_by == "shape":
                assert any(
                    w.shape != e.shape for w, e in zip(values, expected[i].values(), strict=True)
                )
            else:
                gap = max((w.double() - e.double()).abs().max().item()
                          for w, e in zip(values, expected[i].values(), strict=True))  # fmt: skip
                assert gap > 1e3 * max(ex.atol, 1e-9), (mistake.why, gap)
        for j in range(k):
            assert not ee._same(outcomes[j][i], wrong, ex.atol, ex.rtol), (
                f"{ex.mistakes[j].why!r} is named for {mistake.why!r} on case {i}"
            )


def test_the_scratch_names_load_the_package_weights_exactly():
    task = tc.data.DateTask()
    config = tc.encoder_decoder.Seq2SeqConfig(
        task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, 24, 4, 2, 3
    )
    package = ee.package_seq2seq(config)
    ours = scratch.Seq2Seq(config).double().eval()
    ours.load_state_dict(ee.scratch_state_dict(package), strict=True)
    src, tgt = task.tensors(task.sample(3, seed=0))
    with torch.no_grad():
        torch.testing.assert_close(ours(src, tgt[:, :-1]), package(src, tgt[:, :-1])[0])
    assert ee.scratch_names("decoder.blocks.1.cross_attn.in_proj.bias") == tuple(
        f"decoder.1.cross_attn.W_{x}.bias" for x in "qkv"
    )
    assert ee.scratch_names("decoder.blocks.0.norm3.weight") == ("decoder.0.ln3.weight",)
    assert ee.scratch_names("norm2.bias") == ("ln2.bias",)  # a block on its own
    assert ee.scratch_names("head.weight") == ("W_vocab.weight",)


def test_the_checkers_leave_the_random_state_and_the_threads_alone():
    torch.set_num_threads(2)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    for name in PARTS:
        assert check(name, tc.exercises._get(name).solution)
    torch.testing.assert_close(torch.rand(3), expected)
    assert torch.get_num_threads() == 2


# ----------------------------------------------------------------------------------------------
# Other answers: correct ones written differently pass; unexplained ones are located


class LoopedBlock(scratch.DecoderBlock):
    """A correct block written with its own names and a mask built by broadcasting."""

    def forward(self, X, X_mem, causal, mem_mask):
        stream = X
        for norm, attend, reads in (
            (self.ln1, self.self_attn, None),
            (self.ln2, self.cross_attn, X_mem),
        ):
            h = norm(stream)
            kv = h if reads is None else reads
            mask = causal if reads is None else mem_mask.expand(-1, X.shape[1], -1)
            stream = stream + attend(h, kv, kv, mask)
        return stream + self.mlp(self.ln3(stream))


def looped_greedy(model, src, bos, eos):
    """A correct greedy decoder that keeps a list of rows and pads them at the end."""
    c = model.config
    with torch.no_grad():
        X_mem, keep = model.encode(src)
        out = torch.full((len(src), 1), bos)
        alive = torch.ones(len(src), dtype=torch.bool)
        while out.shape[1] < c.tgt_len and alive.any():
            nxt = model.decode(out, X_mem, keep)[:, -1].argmax(-1)
            nxt[~alive] = c.pad_id
            out = torch.cat([out, nxt[:, None]], dim=1)
            alive &= nxt != eos
    return F.pad(out, (0, c.tgt_len - out.shape[1]), value=c.pad_id)


def transposed_step(model, optimizer, src, tgt):
    """A correct step that gives cross_entropy the classes on dim 1 and masks by hand."""
    logits = model(src, tgt[:, :-1]).transpose(1, 2)  # (B, |V|, N)
    each = F.cross_entropy(logits, tgt[:, 1:], reduction="none")
    real = tgt[:, 1:] != model.config.pad_id
    loss = each[real].mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss  # a tensor is accepted as the number it holds


@pytest.mark.parametrize(
    ("name", "answer"),
    [
        ("encoder_decoder.decoder_block", LoopedBlock),
        ("encoder_decoder.greedy_decode", looped_greedy),
        ("encoder_decoder.train_step", transposed_step),
    ],
)
def test_other_correct_answers_pass(name, answer):
    feedback = check(name, answer)
    assert feedback.status == "correct", str(feedback)


def test_a_block_no_single_mistake_explains_is_located_by_its_sub_layer():
    class ReLUMLP(scratch.DecoderBlock):  # the MLP's activation changed: its input is still right
        def forward(self, X, X_mem, causal, mem_mask):
            h = self.ln1(X)
            X1 = X + self.self_attn(h, h, h, causal)
            X2 = X1 + self.cross_attn(self.ln2(X1), X_mem, X_mem, mem_mask)
            return X2 + self.mlp.fc2(torch.relu(self.mlp.fc1(self.ln3(X2))))

    class KeysFromTheInput(scratch.DecoderBlock):  # K, V from the block's raw input X
        def forward(self, X, X_mem, causal, mem_mask):
            h = self.ln1(X)
            X1 = X + self.self_attn(h, X, X, causal)
            X2 = X1 + self.cross_attn(self.ln2(X1), X_mem, X_mem, mem_mask)
            return X2 + self.mlp(self.ln3(X2))

    class QueriesUnnormalised(scratch.DecoderBlock):  # cross-attention's queries from X' itself
        def forward(self, X, X_mem, causal, mem_mask):
            h = self.ln1(X)
            X1 = X + self.self_attn(h, h, h, causal)
            X2 = X1 + self.cross_attn(X1, X_mem, X_mem, mem_mask)
            return X2 + self.mlp(self.ln3(X2))

    def message(cls):
        fb = check("encoder_decoder.decoder_block", cls)
        assert fb.status == "incorrect", str(fb)
        return fb.message

    assert "every sub-layer reads the right input" in message(ReLUMLP)
    assert "self-attention does not read LN_1(X)" in message(KeysFromTheInput)
    assert "queries are not LN_2(X')" in message(QueriesUnnormalised)


def test_unattempted_broken_and_misnamed_answers_are_reported_not_raised():
    class Stub(scratch.DecoderBlock):
        def forward(self, X, X_mem, causal, mem_mask):
            raise NotImplementedError

    class Renamed(torch.nn.Module):
        def __init__(self, D, H):
            super().__init__()
            self.attn = scratch.MultiHeadAttention(D, H)

    class Crashes(scratch.DecoderBlock):
        def forward(self, X, X_mem, causal, mem_mask):
            return self.ln1(X) @ X_mem  # (B, N, D) @ (B, M, D): shapes do not fit

    assert check("encoder_decoder.decoder_block", Stub).status == "not attempted"
    assert check("encoder_decoder.decoder_block", None).status == "not attempted"
    fb = check("encoder_decoder.decoder_block", Renamed)
    assert fb.status == "incorrect" and "lab's names" in fb.message
    fb = check("encoder_decoder.decoder_block", Crashes)
    assert fb.status == "error" and "RuntimeError" in fb.message and "line" in fb.message
    fb = check("encoder_decoder.train_step", lambda model, optimizer, src, tgt: "done")
    assert fb.status == "incorrect" and "loss as a number" in fb.message
    fb = check("encoder_decoder.greedy_decode", lambda model, src, bos, eos: src.tolist())
    assert fb.status == "incorrect" and "must return a tensor" in fb.message


def test_the_greedy_cases_end_rows_at_different_steps_and_let_one_run_to_the_end():
    """What the greedy mistakes need to show: EOS at different steps, and a row without EOS; and a case
    where every row ends early, so that a decoder returning fewer than tgt_len positions fails."""
    first, second, third = ee._greedy_cases()
    for case in (first, second):
        tokens = ee._expected_greedy(case)["the tokens"]
        ends = [row.index(ee.EOS) if ee.EOS in row else None for row in tokens.tolist()]
        assert None in ends and len({e for e in ends if e is not None}) >= 2, ends
        assert (tokens[:, 0] == ee.BOS).all()
    tokens = ee._expected_greedy(third)["the tokens"]
    assert (tokens == ee.EOS).any(dim=1).all() and (tokens[:, -1] == ee.PAD).all()


def trimmed_greedy(model, src, bos, eos):
    """Greedy decoding that returns only the positions it wrote (a learner's concatenating loop)."""
    with torch.no_grad():
        X_mem, keep = model.encode(src)
        out = torch.full((len(src), 1), bos)
        done = torch.zeros(len(src), dtype=torch.bool)
        while out.shape[1] < model.config.tgt_len and not done.all():
            nxt = model.decode(out, X_mem, keep)[:, -1].argmax(-1)
            nxt = torch.where(done, model.config.pad_id, nxt)
            done |= nxt == eos
            out = torch.cat([out, nxt[:, None]], dim=1)
    return out


def test_a_decoder_that_stops_short_of_tgt_len_is_named():
    feedback = check("encoder_decoder.greedy_decode", trimmed_greedy)
    assert feedback.status == "incorrect" and "(B, tgt_len)" in feedback.message, str(feedback)


# ----------------------------------------------------------------------------------------------
# The attention class and the decoder's forward pass


class LoopedAttention(scratch.MultiHeadAttention):
    """A correct attention class: one head at a time, the mask broadcast by expand."""

    def forward(self, X, X_k, X_v, mask=None):
        Q, K, V = self.W_q(X), self.W_k(X_k), self.W_v(X_v)
        heads = []
        for h in range(self.H):
            c = slice(h * self.d_k, (h + 1) * self.d_k)
            S = Q[..., c] @ K[..., c].transpose(-2, -1) / self.d_k**0.5  # (B, N, M)
            if mask is not None:
                S = S.masked_fill(~mask.expand(S.shape), float("-inf"))
            heads.append(torch.softmax(S, dim=-1) @ V[..., c])
        return self.W_o(torch.cat(heads, dim=-1))


class StepwiseDecode(scratch.Seq2Seq):
    """A correct decode: the masks built by comparing positions."""

    def decode(self, tgt_in, X_mem, keep):
        n = torch.arange(tgt_in.shape[1])
        X = self.E_tgt(tgt_in) + self.R_tgt.weight[n]
        causal = n[None, :] <= n[:, None]  # key m <= query n
        for block in self.decoder:
            X = block(X, X_mem, causal, keep.unsqueeze(1))
        return self.W_vocab(self.ln_dec(X))


@pytest.mark.parametrize(
    ("name", "answer"),
    [("encoder_decoder.attention", LoopedAttention), ("encoder_decoder.decode", StepwiseDecode)],
)
def test_other_correct_attention_and_decode_pass(name, answer):
    feedback = check(name, answer)
    assert feedback.status == "correct", str(feedback)


def test_a_block_that_gives_the_cross_attention_the_causal_mask_is_located_not_left_to_torch():
    """The call fails inside torch (an (N, N) mask against (B, H, N, M) scores); the checker quotes the
    error and says which sub-layer was given the wrong mask."""

    class CausalInCross(scratch.DecoderBlock):
        def forward(self, X, X_mem, causal, mem_mask):
            h = self.ln1(X)
            X1 = X + self.self_attn(h, h, h, causal)
            X2 = X1 + self.cross_attn(self.ln2(X1), X_mem, X_mem, causal)
            return X2 + self.mlp(self.ln3(X2))

    feedback = check("encoder_decoder.decoder_block", CausalInCross)
    assert feedback.status == "error" and "RuntimeError" in feedback.message
    assert "cross-attention's mask is not mem_mask (the causal mask (N, N)?)" in feedback.message


def test_the_lab_model_built_from_the_references_is_the_file_s_model():
    """``lab_seq2seq`` puts the given attention class in every attention layer, the encoder's
    included, and the given block and decode; with the references it computes the file's model."""
    task = tc.data.DateTask()
    config = tc.encoder_decoder.Seq2SeqConfig(
        task.vocab_size, task.vocab_size, task.src_len, task.tgt_len, 16, 2, 2, 2
    )
    Model = ee.lab_seq2seq(LoopedAttention, scratch.DecoderBlock, StepwiseDecode.decode)
    model = Model(config).double().eval()
    assert all(type(b.attn) is LoopedAttention for b in model.encoder)
    assert all(type(b.cross_attn) is LoopedAttention for b in model.decoder)
    model.load_state_dict(ee.scratch_state_dict(ee.package_seq2seq(config)), strict=True)
    src, tgt = task.tensors(task.sample(3, seed=2))
    with torch.no_grad():
        torch.testing.assert_close(
            model(src, tgt[:, :-1]), ee.package_seq2seq(config)(src, tgt[:, :-1])[0]
        )
        copy = ee.package_copy(model)  # and back into the package's model, weight for weight
        torch.testing.assert_close(copy(src, tgt[:, :-1])[0], model(src, tgt[:, :-1]))
    assert ee.lab_seq2seq().parts == ee.REFERENCE_PARTS


# ----------------------------------------------------------------------------------------------
# Training the lab's model on dates

RECIPE = tc.encoder_decoder.DATES_RECIPE.with_train(time_budget_s=None)


def test_training_the_references_inline_is_the_chapters_run():
    """``train_on_dates`` trains the lab's model inline; with the reference parts and step (here
    passed as wrappers, so that the inline path runs) it gives the losses of the chapter's
    ``train_dates`` and its weights up to float32 rounding (the file's attention against the package's
    fused kernel), and it returns the chapter's run itself when it is handed the references."""
    chapter = tc.encoder_decoder.train_dates(RECIPE, "cpu", 4)
    Model = ee.lab_seq2seq(
        scratch.MultiHeadAttention,
        scratch.DecoderBlock,
        lambda self, *args: scratch.Seq2Seq.decode(self, *args),  # the reference, not the object
    )
    inline = ee.train_on_dates(Model, lambda *args: ee.train_step(*args), RECIPE, "cpu", 4)
    shortcut = ee.train_on_dates(ee.lab_seq2seq(), ee.train_step, RECIPE, "cpu", 4)
    assert not inline.chapter_run and shortcut.chapter_run
    assert shortcut.losses == chapter.history.train_loss
    torch.testing.assert_close(inline.losses, chapter.history.train_loss, atol=1e-5, rtol=0)
    assert chapter.history.train_loss[0] > chapter.history.train_loss[-1]  # the steps are no no-op
    for run in (inline, shortcut):
        assert run.train_pairs == chapter.train_pairs
        for k, v in chapter.model.state_dict().items():
            torch.testing.assert_close(run.package.state_dict()[k], v, atol=1e-5, rtol=0)


def test_the_chapters_run_is_reused_by_the_lab(monkeypatch, tmp_path):
    """``train_dates`` is a ``reusable_run``: with the run store set, the lab's call after the
    chapter's, with the reference parts, loads the chapter's run instead of training again."""
    fn = tc.encoder_decoder.train_dates
    monkeypatch.setenv(tc.runtime.RUN_STORE_ENV, str(tmp_path))
    first = fn(RECIPE, torch.device("cpu"), 2)
    assert len(list(tmp_path.glob("train_dates-*.pt"))) == 1
    monkeypatch.setattr(tc.encoder_decoder, "train", lambda *a, **k: pytest.fail("trained twice"))
    again = ee.train_on_dates(ee.lab_seq2seq(), ee.train_step, RECIPE, torch.device("cpu"), 2)
    assert again.chapter_run and again.losses == first.history.train_loss


def test_the_training_case_has_padded_targets_of_different_lengths():
    _, batches = ee._step_cases()[0]
    for _, tgt in batches:
        lengths = (tgt != ee.PAD).sum(dim=1)
        assert lengths.min() < tgt.shape[1] and len(set(lengths.tolist())) > 1
