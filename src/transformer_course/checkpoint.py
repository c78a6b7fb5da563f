"""Saving and resuming a training run: everything the next step depends on, written so that a
half-written file never replaces a good one.

Shared infrastructure (not a chapter): the one training loop, :func:`.train.train`, saves with
``checkpoint_path=`` and resumes with ``resume_from=``, and every model's run function passes them on
(``language_models.train_char_lm``); chapter *Training* explains it (section *Saving and resuming a
run*, ``tests/test_checkpoint.py``).

A run resumed from the checkpoint written after ``k`` steps continues exactly as the run that was never
interrupted, bit for bit on the same machine, because the checkpoint holds every input of step ``k + 1``:

* the model's weights and the optimiser's state (AdamW's moments and its step count, which the bias
  correction divides by);
* ``k`` itself, the position in the learning-rate schedule (:func:`.train.lr_at`);
* the state of the generator that draws the batches, so the batches still to come are the same;
* the state of every other random number generator of the process: PyTorch's on the CPU (dropout
  masks), on every CUDA device when there is one, Python's ``random`` and NumPy's;
* the :class:`.train.History` so far, and the run's settings (the ``TrainConfig`` and, optionally, a
  recipe) with a format version, so that resuming under other settings is refused rather than mixed.

The file is written to a temporary file in the same folder, flushed to the disk, then renamed over the
old one (``os.replace``, atomic on POSIX and Windows): a crash while saving leaves the last good
checkpoint in place.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import pickle
import random
import tempfile
import zipfile
from typing import Any

import numpy as np
import torch
from torch import nn

__all__ = [
    "FORMAT",
    "VERSION",
    "atomic_save",
    "check_same_run",
    "load_checkpoint",
    "load_model_state",
    "resume",
    "rng_state",
    "save_checkpoint",
    "set_rng_state",
]

FORMAT = "transformer_course.checkpoint"
VERSION = 1
NOT_COMPARED = frozenset({"time_budget_s"})
"""Settings a resumed run may change: a wall-clock budget does not change what a step computes."""


def rng_state() -> dict[str, Any]:
    """The state of every random number generator of this process: PyTorch's CPU generator, every
    CUDA device's (when CUDA is available), Python's ``random`` and NumPy's global generator."""
    numpy = np.random.get_state(legacy=False)  # noqa: NPY002 (the global generator)
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {**numpy, "state": {**numpy["state"], "key": torch.from_numpy(
            numpy["state"]["key"].astype(np.int64))}},  # a tensor: loadable with weights_only
    }  # fmt: skip
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` captured. A CUDA state is restored when CUDA is available (a
    checkpoint from a GPU resumed on a CPU-only machine cannot repeat the GPU's random numbers)."""
    torch.set_rng_state(state["torch"])
    random.setstate(_as_tuples(state["python"]))
    numpy = state["numpy"]
    key = numpy["state"]["key"].numpy().astype(np.uint32)
    numpy = {**numpy, "state": {**numpy["state"], "key": key}}
    np.random.set_state(numpy)  # noqa: NPY002 (the global generator, as rng_state saved it)
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(x: Any) -> Any:
    """Python's ``random.setstate`` wants tuples; a checkpoint may hand back lists."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, list | tuple) else x


def atomic_save(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save(obj)`` to ``path`` so that ``path`` holds either the old file or the whole new one:
    write a temporary file in the same folder, flush it and ``fsync`` it to the disk, then
    ``os.replace`` it over ``path``. On any error the temporary file is removed and ``path`` is left as
    it was."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on the disk before the name points at them
        os.replace(tmp, path)  # atomic: the old checkpoint until this line, the new one after it
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    try:  # make the rename itself durable (POSIX); not possible on every system
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError:
        pass


def save_checkpoint(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    step: int,
    generator: torch.Generator,
    history: Any,
    config: Any,
    run: dict | None = None,
) -> None:
    """Save what the next update of a run depends on to ``path``, atomically (:func:`atomic_save`):
    after ``step`` updates, the ``model``'s and ``optimizer``'s state (unwrap a DDP model first), the
    batch ``generator``'s, every other generator's (:func:`rng_state`), the ``history`` so far, and
    the run's ``config`` (a ``TrainConfig``) and ``run`` (plain data, e.g. the recipe), which
    :func:`check_same_run` compares when resuming."""
    atomic_save(
        {
            "format": FORMAT,
            "version": VERSION,
            "step": step,  # the position in the learning-rate schedule
            "config": dataclasses.asdict(config),
            "run": run or {},
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),  # AdamW's moments and step counts
            "generator": generator.get_state(),  # the batches still to come
            "rng": rng_state(),  # dropout masks, and anything else drawn at random
            "history": dataclasses.asdict(history),
        },
        path,
    )


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint written by :func:`save_checkpoint`, with PyTorch's safe loader
    (``weights_only=True``: tensors and plain data, no arbitrary code).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is not a checkpoint of this package (not a PyTorch file, a truncated
            one, or a model saved with ``GPT.save``), or its format version is not this package's.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no checkpoint at {path}; pass the checkpoint_path a run saved to, or start without "
            "resume_from"
        )
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError) as err:
        raise ValueError(
            f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err)[:120]}); it may "
            "be truncated or another kind of file. Pass a file written by train(..., "
            "checkpoint_path=...), or start without resume_from"
        ) from err
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        keys = sorted(ckpt)[:6] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ValueError(
            f"{path} is a PyTorch file but not a training checkpoint (it holds {keys}); a model "
            "saved with GPT.save is loaded with GPT.load, and a run resumes from the file written by "
            "train(..., checkpoint_path=...)"
        )
    if ckpt.get("version") != VERSION:
        raise ValueError(
            f"{path} has checkpoint format version {ckpt.get('version')!r}, but this version of "
            f"transformer_course reads version {VERSION}; resume it with the version of the package "
            "that wrote it, or start the run again"
        )
    return ckpt


def _differences(saved: Any, current: Any, where: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            if key in NOT_COMPARED:
                continue
            name = f"{where}.{key}" if where else str(key)
            if key not in saved or key not in current:
                out.append(f"{name} only {'here' if key in current else 'in the checkpoint'}")
            else:
                out += _differences(saved[key], current[key], name)
        return out
    if isinstance(saved, list | tuple) and isinstance(current, list | tuple):
        saved, current = list(saved), list(current)
    return [] if saved == current else [f"{where}: {saved!r} in the checkpoint, {current!r} here"]


def check_same_run(ckpt: dict, config: Any, run: dict | None = None) -> None:
    """Refuse to resume under other settings: the checkpoint's ``TrainConfig`` and ``run`` must equal
    ``config`` and ``run``, except the settings in :data:`NOT_COMPARED` (the time budget).

    Raises:
        ValueError: naming every setting that differs, with both values.
    """
    diffs = _differences(ckpt["config"], dataclasses.asdict(config), "config")
    diffs += _differences(ckpt["run"], run or {}, "run")
    if diffs:
        raise ValueError(
            "the checkpoint was written by a run with other settings: "
            + "; ".join(diffs)
            + ". Resume with the settings that wrote it (another learning rate or step count "
            "changes the schedule), or start a new run without resume_from"
        )


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """``model.load_state_dict(state)``, after checking that every tensor is there with its shape.

    Raises:
        ValueError: naming each tensor whose shape differs (with both shapes), and the tensors that
            only the checkpoint or only the model has.
    """
    own = model.state_dict()
    wrong = [
        f"{k}: {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} in the model"
        for k, v in state.items()
        if k in own and v.shape != own[k].shape
    ]
    extra, missing = sorted(set(state) - set(own)), sorted(set(own) - set(state))
    if wrong or extra or missing:
        parts = (["shapes differ: " + "; ".join(wrong)] if wrong else []) + (
            [f"only in the checkpoint: {extra}"] if extra else []
        ) + ([f"only in the model: {missing}"] if missing else [])  # fmt: skip
        raise ValueError(
            "the checkpoint is of a model of another shape: " + ". ".join(parts)
            + ". Build the model with the configuration that wrote the checkpoint"
        )  # fmt: skip
    model.load_state_dict(state)


def resume(
    path: str | os.PathLike,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    generator: torch.Generator,
    config: Any,
    run: dict | None = None,
) -> tuple[int, dict]:
    """Restore a run from the checkpoint at ``path`` into ``model``, ``optimizer``, ``generator`` and
    every random number generator; return ``(step, history)``: the loop's next step and the history
    so far as a dict.

    Raises:
        ValueError: see :func:`load_checkpoint`, :func:`check_same_run` and :func:`load_model_state`.
    """
    ckpt = load_checkpoint(path)
    check_same_run(ckpt, config, run)
    load_model_state(model, ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])  # moves the moments to the parameters' device
    generator.set_state(ckpt["generator"])
    set_rng_state(ckpt["rng"])
    return int(ckpt["step"]), ckpt["history"]
