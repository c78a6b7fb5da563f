"""GPT-2's weights in the course's GPT (``GPT.from_huggingface``), offline: a Hugging Face
``GPT2LMHeadModel`` built from a small config with random weights (nothing is downloaded) gives the same
logits as the course's model holding its weights, and the same greedy continuation."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from transformer_course.block import gelu, gelu_tanh
from transformer_course.language_models import GPT, generate, gpt2_state_dict

transformers = pytest.importorskip("transformers")


def _gpt2(seed=0, **overrides):
    settings = dict(vocab_size=97, n_positions=24, n_embd=32, n_layer=2, n_head=4,
                    resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)  # fmt: skip
    torch.manual_seed(seed)
    config = transformers.GPT2Config(**{**settings, **overrides})
    model = transformers.GPT2LMHeadModel(config).eval()
    with torch.no_grad():  # LayerNorms and biases away from their initial 1 and 0, so a swap shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("shape", [(1, 1), (2, 7), (3, 24)])
def test_the_loaded_gpt_gives_gpt2s_logits(dtype, tol, shape):
    hf = _gpt2().to(dtype)
    ours = GPT.from_huggingface(hf)
    assert ours.config.activation == "gelu_tanh" and ours.config.block_size == 24
    assert next(ours.parameters()).dtype == dtype and not ours.training
    idx = torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = hf(idx).logits
        mine = ours(idx)[0]
    assert (mine - theirs).abs().max().item() <= tol
    if (
        dtype == torch.float64
    ):  # a real alternative misses: the exact GELU instead of GPT-2's tanh form
        exact = GPT(dataclasses.replace(ours.config, activation="gelu")).to(dtype).eval()
        exact.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert (exact(idx)[0] - theirs).abs().max().item() > 100 * tol


def test_the_loaded_gpt_continues_a_prompt_as_gpt2s_generate_does():
    hf = _gpt2(seed=2).double()
    ours = GPT.from_huggingface(hf)
    prompt = torch.tensor([[5, 17, 42]])
    theirs = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    mine = generate(ours, prompt, 12, greedy=True)
    assert mine.tolist() == theirs.tolist()


def test_the_untransposed_conv1d_weights_give_other_logits():
    """Conv1D stores (in, out): loading c_attn's weight without the transpose (a square block of it
    would fit nn.Linear's shape only in a model with as many outputs as inputs) is caught by shape, and
    c_proj's square weight loaded untransposed fits but computes another function."""
    hf = _gpt2(seed=3).double()
    ours = GPT.from_huggingface(hf)
    state = hf.state_dict()
    wrong = dict(gpt2_state_dict(state, ours.config))
    wrong["stack.blocks.0.attn.out_proj.weight"] = state["transformer.h.0.attn.c_proj.weight"]
    slipped = GPT(ours.config).double().eval()
    slipped.load_state_dict(wrong)
    idx = torch.arange(10)[None]
    with torch.no_grad():
        assert (slipped(idx)[0] - hf(idx).logits).abs().max().item() > 1e-3


def test_a_state_dict_of_another_shape_names_the_first_tensor_that_does_not_fit():
    hf = _gpt2()
    ours = GPT.from_huggingface(hf)
    state = dict(hf.state_dict())
    state["transformer.h.1.mlp.c_fc.weight"] = torch.zeros(32, 64)
    with pytest.raises(
        ValueError, match=r"transformer\.h\.1\.mlp\.c_fc\.weight has shape \(32, 64\)"
    ):
        gpt2_state_dict(state, ours.config)
    del state["transformer.ln_f.bias"]
    state["transformer.h.1.mlp.c_fc.weight"] = hf.state_dict()["transformer.h.1.mlp.c_fc.weight"]
    with pytest.raises(ValueError, match=r"no 'transformer\.ln_f\.bias'"):
        gpt2_state_dict(state, ours.config)


def test_settings_the_course_cannot_reproduce_are_refused():
    with pytest.raises(ValueError, match="activation_function='relu'"):
        GPT.from_huggingface(_gpt2(activation_function="relu"))
    with pytest.raises(ValueError, match="n_inner=48"):
        GPT.from_huggingface(_gpt2(n_inner=48))
    with pytest.raises(ValueError, match="expected a transformers GPT2LMHeadModel"):
        GPT.from_huggingface(torch.nn.Linear(2, 2))


def test_gelu_tanh_is_the_formula_and_not_the_exact_gelu():
    x = torch.linspace(-6, 6, 2001, dtype=torch.float64)
    formula = 0.5 * x * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (x + 0.044715 * x**3)))
    assert (gelu_tanh(x) - formula).abs().max().item() < 1e-14
    assert (gelu(x) - formula).abs().max().item() > 1e-4  # the two forms are different functions
    assert torch.equal(gelu(x), F.gelu(x))


def _ranks_file(path, ranks):
    import base64

    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return path


def test_gpt2_tokenizer_from_a_ranks_file_gives_tiktokens_ids(tmp_path):
    """The sample's part of the table written as a .tiktoken file: the tokenizer built from it encodes
    the sample to tiktoken's ids; the recorded sha256 (the full table's) refuses the partial file."""
    import transformer_course as tc

    sample = tc.tokens.gpt2_sample()
    path = _ranks_file(tmp_path / "part.tiktoken", sample.ranks)
    tok = tc.tokens.gpt2_tokenizer(path, sha256=None)
    assert tok.encode(sample.text) == sample.ids
    with pytest.raises(ValueError, match="not GPT-2's 306cd27f"):
        tc.tokens.gpt2_tokenizer(path)


def test_gpt2s_weights_load_into_the_scratch_gpt_as_lab_7_loads_them():
    """Lab 7's optional part: scratch_state_dict renames GPT-2's weights (through the course's GPT) for
    scratch/gpt.py's classes, which load them strictly; with the exact GELU in place of GPT-2's tanh
    form, the logits move by less than 1e-3 here, and the greedy continuation is GPT-2's."""
    from transformer_course.language_models import scratch_state_dict
    from transformer_course.scratch import gpt as scratch

    hf = _gpt2(seed=4).double()
    ours = GPT.from_huggingface(hf)
    yours = scratch.GPT(dataclasses.replace(ours.config, activation="gelu")).double().eval()
    yours.load_state_dict(scratch_state_dict(ours))
    idx = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        gap = (yours(idx)[0] - hf(idx).logits).abs().max().item()
    assert 1e-12 < gap < 1e-3  # not equal (another GELU), but close
    theirs = hf.generate(idx, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert scratch.generate(yours, idx, 8, greedy=True).tolist() == theirs.tolist()
