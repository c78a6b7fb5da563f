"""Checkpoints: a resumed run equals the uninterrupted one bit for bit, every part of the state matters,
a crash while saving keeps the old file, and every wrong use is refused with a message that says how
to fix it."""

from __future__ import annotations

import dataclasses
import pathlib
import random

import numpy as np
import pytest
import torch

import transformer_course as tc
from transformer_course import checkpoint
from transformer_course.data import get_batch
from transformer_course.language_models import GPT, TINY
from transformer_course.train import TrainConfig, train

# dropout > 0, so the process's RNG matters; a warm-up that the crash interrupts, so the step matters
CONFIG = dataclasses.replace(TINY, dropout=0.1)
CFG = TrainConfig(max_steps=24, lr=3e-3, warmup_steps=12, eval_interval=8)
IDS = torch.randint(0, 65, (600,), generator=torch.Generator().manual_seed(0))
HELD_OUT = get_batch(IDS, 16, 4, torch.Generator().manual_seed(1))


class Crash(Exception):
    """The process dies (a pre-empted job, a lost node)."""


def _run(cfg=CFG, crash_at=None, seed=0, **kwargs):
    """A float32 run of a small GPT; ``crash_at``: the batch draw at which the process dies."""
    torch.manual_seed(seed)
    model = GPT(CONFIG)
    draws = [0]

    def next_batch(g):
        if draws[0] == crash_at:
            raise Crash
        draws[0] += 1
        return get_batch(IDS, 16, 4, g)

    def evaluate(m):
        return {"val_loss": m(*HELD_OUT)[1].item()}

    hist = train(model, next_batch, lambda m, b: m(*b)[1], cfg, evaluate, False, **kwargs)
    return model, hist


def _restart(seed=7):
    """What a new process looks like: other seeds everywhere."""
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 (the global generator a checkpoint restores)


def _same_run(a, b, evals=True):
    (model_a, hist_a), (model_b, hist_b) = a, b
    assert hist_a.train_loss == hist_b.train_loss  # exact equality of every float
    assert hist_a.grad_norm == hist_b.grad_norm and hist_a.lr == hist_b.lr
    if evals:
        assert hist_a.evals == hist_b.evals and hist_a.eval_step == hist_b.eval_step
    assert hist_a.step == hist_b.step and hist_a.steps_done == hist_b.steps_done
    pa, pb = dict(model_a.named_parameters()), dict(model_b.named_parameters())
    assert pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa)


def _crashed_run(tmp_path: pathlib.Path) -> pathlib.Path:
    """Runs until the process dies at step 10 of 24; its last checkpoint is from step 6 (inside the
    warm-up of 12 steps)."""
    path = tmp_path / "run.pt"
    with pytest.raises(Crash):
        _run(crash_at=10, checkpoint_path=path, checkpoint_every=6)
    assert checkpoint.load_checkpoint(path)["step"] == 6
    return path


def test_a_resumed_run_equals_the_uninterrupted_one_bit_for_bit(tmp_path):
    uninterrupted = _run()
    path = _crashed_run(tmp_path)
    _restart()
    resumed = _run(resume_from=path)
    _same_run(resumed, uninterrupted)
    assert resumed[1].steps_done == 24 and len(resumed[1].evals["val_loss"]) == 3


def test_resuming_twice_and_checkpoints_at_the_end_and_on_a_time_budget(tmp_path):
    uninterrupted = _run()
    path = _crashed_run(tmp_path)
    with pytest.raises(Crash):  # resumed at 6, checkpoints at 12 and 18, dies at step 20
        _run(crash_at=14, resume_from=path, checkpoint_path=path, checkpoint_every=6)
    assert checkpoint.load_checkpoint(path)["step"] == 18
    _restart(3)
    final = tmp_path / "final.pt"
    _same_run(_run(resume_from=path, checkpoint_path=final), uninterrupted)
    assert checkpoint.load_checkpoint(final)["step"] == 24  # saved when the run ends
    budget = tmp_path / "budget.pt"  # a time budget spent at once: saved after one step
    _, hist = _run(dataclasses.replace(CFG, time_budget_s=0.0), checkpoint_path=budget)
    assert hist.steps_done == 1 and checkpoint.load_checkpoint(budget)["step"] == 1
    _restart()
    resumed = _run(resume_from=budget)  # the budget may change on resume
    _same_run(resumed, uninterrupted, evals=False)
    assert resumed[1].eval_step == [1, 8, 16, 24]  # the stopped run evaluated when it stopped
    assert resumed[1].evals["val_loss"][1:] == uninterrupted[1].evals["val_loss"]


def _resume_edited(tmp_path, edit):
    """Resume from a copy of the crashed run's checkpoint in which ``edit`` left something out."""
    ckpt = checkpoint.load_checkpoint(_crashed_run(tmp_path))
    edit(ckpt)
    edited = tmp_path / "edited.pt"
    torch.save(ckpt, edited)
    _restart()
    return _run(resume_from=edited)


def _fresh_process_rng(ckpt):
    torch.manual_seed(0)  # a restarted process: seeded again, the model built again
    GPT(CONFIG)
    ckpt["rng"] = checkpoint.rng_state()


@pytest.mark.parametrize(
    "what, edit",
    [
        ("the process's RNG (dropout masks)", _fresh_process_rng),
        (
            "the batch generator",
            lambda c: c.__setitem__("generator", torch.Generator().get_state()),
        ),
        ("the optimizer's moments", lambda c: c["optimizer"].__setitem__("state", {})),
        ("the step", lambda c: c.__setitem__("step", 0)),
    ],
)
def test_every_part_of_the_state_changes_the_run(tmp_path, what, edit):
    uninterrupted = _run()
    model, hist = _resume_edited(tmp_path, edit)
    assert hist.train_loss[6:] != uninterrupted[1].train_loss[6:], what
    assert not torch.equal(model.lm_head.weight, uninterrupted[0].lm_head.weight), what


def test_every_random_number_generator_is_restored():
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)  # noqa: NPY002
    state = checkpoint.rng_state()
    first = (torch.rand(3), random.random(), np.random.rand(3))  # noqa: NPY002
    _restart()
    checkpoint.set_rng_state(state)
    again = (torch.rand(3), random.random(), np.random.rand(3))  # noqa: NPY002
    assert torch.equal(first[0], again[0]) and first[1] == again[1]
    assert np.array_equal(first[2], again[2])


def test_a_crash_while_saving_leaves_the_old_checkpoint(tmp_path, monkeypatch):
    path = _crashed_run(tmp_path)
    good = path.read_bytes()
    real_save = torch.save

    def dies_half_way(obj, f, *args, **kwargs):
        real_save(obj, f, *args, **kwargs)
        f.truncate(len(good) // 2)  # half of the bytes are written, then the disk fills up
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", dies_half_way)
    with pytest.raises(OSError, match="No space"):
        _run(crash_at=10, checkpoint_path=path, checkpoint_every=3)
    monkeypatch.undo()
    assert path.read_bytes() == good and checkpoint.load_checkpoint(path)["step"] == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt"]  # no temporary file left
    _restart()
    _same_run(_run(resume_from=path), _run())


def test_a_file_written_in_place_and_cut_short_would_be_lost(tmp_path):
    """Why the temporary file: writing over the checkpoint itself and dying half-way destroys it."""
    path = _crashed_run(tmp_path)
    good = path.read_bytes()
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        checkpoint.load_checkpoint(path)


def test_a_model_of_another_shape_is_named_tensor_by_tensor(tmp_path):
    path = _crashed_run(tmp_path)
    wider = GPT(dataclasses.replace(CONFIG, d_model=48, H=2))
    with pytest.raises(ValueError) as err:
        checkpoint.load_model_state(wider, checkpoint.load_checkpoint(path)["model"])
    message = str(err.value)
    assert "tok_emb.weight: (65, 32) in the checkpoint, (65, 48) in the model" in message
    assert "stack.blocks.0.mlp.fc1.weight: (128, 32) in the checkpoint, (192, 48)" in message
    assert "Build the model with the configuration that wrote the checkpoint" in message
    deeper = GPT(dataclasses.replace(CONFIG, n_layers=3))
    with pytest.raises(ValueError, match=r"only in the model: \['stack.blocks.2"):
        checkpoint.load_model_state(deeper, checkpoint.load_checkpoint(path)["model"])


@pytest.mark.parametrize(
    "change, named",
    [
        ({"lr": 1e-3}, "config.lr: 0.003 in the checkpoint, 0.001 here"),
        ({"max_steps": 30}, "config.max_steps: 24 in the checkpoint, 30 here"),
        ({"accumulate": 2}, "config.accumulate: 1 in the checkpoint, 2 here"),
    ],
)
def test_a_checkpoint_of_other_settings_is_refused(tmp_path, change, named):
    path = _crashed_run(tmp_path)
    with pytest.raises(ValueError, match="other settings") as err:
        _run(dataclasses.replace(CFG, **change), resume_from=path)
    assert named in str(err.value) and "start a new run without resume_from" in str(err.value)


def test_a_checkpoint_of_another_recipe_is_refused(tmp_path):
    path = tmp_path / "run.pt"
    with pytest.raises(Crash):
        _run(crash_at=3, checkpoint_path=path, checkpoint_every=2, run_config={"batch": 4})
    with pytest.raises(ValueError, match=r"run.batch: 4 in the checkpoint, 8 here"):
        _run(resume_from=path, run_config={"batch": 8})


def test_what_is_not_a_checkpoint_is_refused_with_a_way_out(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        checkpoint.load_checkpoint(tmp_path / "missing.pt")
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    with pytest.raises(ValueError, match=r"not a readable checkpoint.*checkpoint_path"):
        checkpoint.load_checkpoint(text)
    weights = tmp_path / "gpt.pt"
    GPT(TINY).save(weights)
    with pytest.raises(ValueError, match=r"not a training checkpoint.*GPT\.load"):
        checkpoint.load_checkpoint(weights)
    ckpt = checkpoint.load_checkpoint(_crashed_run(tmp_path))
    old = tmp_path / "old.pt"
    torch.save({**ckpt, "version": 0}, old)
    with pytest.raises(ValueError, match=r"format version 0.*reads version 1"):
        checkpoint.load_checkpoint(old)


def test_train_char_lm_resumes_bit_for_bit(tmp_path, monkeypatch):
    try:
        tc.data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    from transformer_course import language_models as lm
    from transformer_course.language_models import recipe as lm_recipe  # where train_char_lm draws

    R = tc.training.INSTABILITY_RECIPE
    R = dataclasses.replace(R, model=dataclasses.replace(R.model, dropout=0.1), eval_batches=2)
    R = R.with_train(max_steps=12, warmup_steps=6, eval_interval=6)
    full = lm.train_char_lm(R, seed=3)
    real_get_batch, calls = lm_recipe.get_batch, [0]

    def dies(*args, **kwargs):  # 2 evaluation batches, then training batches; dies at step 8
        calls[0] += 1
        if calls[0] == 2 + 8 + 1:
            raise Crash
        return real_get_batch(*args, **kwargs)

    monkeypatch.setattr(lm_recipe, "get_batch", dies)
    path = tmp_path / "lm.pt"
    with pytest.raises(Crash):
        lm.train_char_lm(R, seed=3, checkpoint_path=path, checkpoint_every=4)
    monkeypatch.undo()
    _restart()
    resumed = lm.train_char_lm(R, seed=3, resume_from=path)
    _same_run((resumed.model, resumed.history), (full.model, full.history))
    with pytest.raises(ValueError, match=r"run.recipe.train.lr: 0.003 in the checkpoint"):
        lm.train_char_lm(R.with_train(lr=1e-3), seed=3, resume_from=path)
    with pytest.raises(ValueError, match=r"config.seed: 3 in the checkpoint, 4 here"):
        lm.train_char_lm(R, seed=4, resume_from=path)


def _model_and_adamw(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(5, 4)).pow(2).mean().backward()
    opt.step()
    return model, opt


@pytest.mark.parametrize("to_file", [False, True])
def test_a_loop_of_your_own_saves_and_resumes_just_a_model_and_an_optimizer(tmp_path, to_file):
    """No generator, history or config: a path or a BytesIO; the model and AdamW's moments come back."""
    import io

    from transformer_course.checkpoint import resume, save_checkpoint

    model, opt = _model_and_adamw(0)
    target = io.BytesIO() if to_file else tmp_path / "mine.pt"
    save_checkpoint(target, model=model, optimizer=opt, step=7)
    if to_file:
        target.seek(0)
    fresh, fresh_opt = _model_and_adamw(1)  # other weights and moments
    step, history = resume(target, model=fresh, optimizer=fresh_opt)
    assert (step, history) == (7, None)
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), fresh.state_dict().values(), strict=True)
    )
    moments = (
        [s["exp_avg"] for s in opt.state.values()],
        [s["exp_avg"] for s in fresh_opt.state.values()],
    )
    assert all(torch.equal(a, b) for a, b in zip(*moments, strict=True))


def test_resume_restores_the_global_generators_only_when_asked(tmp_path):
    from transformer_course.checkpoint import resume, save_checkpoint

    model, opt = _model_and_adamw()
    torch.manual_seed(123)
    save_checkpoint(tmp_path / "c.pt", model=model, optimizer=opt)
    after_save = torch.rand(3)
    torch.manual_seed(999)
    resume(tmp_path / "c.pt", model=model, optimizer=opt, restore_rng=False)
    assert not torch.equal(torch.rand(3), after_save)  # left alone: the 999 stream
    resume(tmp_path / "c.pt", model=model, optimizer=opt)  # restored: the stream at the save
    assert torch.equal(torch.rand(3), after_save)


def test_asking_for_what_was_not_saved_and_a_wrong_file_are_clear_errors(tmp_path):
    from transformer_course.checkpoint import load_checkpoint, resume, save_checkpoint

    model, opt = _model_and_adamw()
    save_checkpoint(tmp_path / "c.pt", model=model, rng=False)
    with pytest.raises(ValueError, match="holds no optimizer and no generator and no rng state"):
        resume(tmp_path / "c.pt", model=model, optimizer=opt, generator=torch.Generator())
    assert resume(tmp_path / "c.pt", model=model, restore_rng=False) == (0, None)
    with pytest.raises(TypeError, match="a path or a binary file object, got int"):
        save_checkpoint(3, model=model)
    with pytest.raises(TypeError, match="a path or a binary file object, got list"):
        load_checkpoint([])
