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

Outside the course's loop, :func:`save_checkpoint` and :func:`resume` take just a model and an optimiser
(and a step): every other part is optional, and a path or a binary file object will do.

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
from typing import Any, BinaryIO

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


def _plain(x: Any) -> Any:
    """A dataclass as a dict (what a checkpoint stores); plain data and ``None`` as they are."""
    return dataclasses.asdict(x) if dataclasses.is_dataclass(x) and not isinstance(x, type) else x


def save_checkpoint(
    file: str | os.PathLike | BinaryIO,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int = 0,
    generator: torch.Generator | None = None,
    history: Any = None,
    config: Any = None,
    run: dict | None = None,
    rng: bool = True,
) -> None:
    """Save what the next update of a run depends on: the ``model``'s state (unwrap a DDP model
    first) and, when given, the ``optimizer``'s (AdamW's moments), the number of updates done
    (``step``, the position in a schedule), the batch ``generator``'s state, the ``history`` so far,
    the run's ``config`` and ``run`` (a dataclass or plain data, which :func:`check_same_run` compares
    when resuming); with ``rng=True`` also the state of the process's global generators
    (:func:`rng_state`: PyTorch's on the CPU and on every CUDA device, Python's ``random``, NumPy's).

    ``file`` is a path, written atomically (:func:`atomic_save`: a crash while saving leaves the old
    file), or a binary file object open for writing (written as it is, e.g. an ``io.BytesIO``). The
    course's loop, :func:`.train.train`, passes everything; a loop of your own may pass only a model
    and an optimizer.
    """
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "step": int(step),
        "config": _plain(config),
        "run": run or {},
        "model": model.state_dict(),
        "optimizer": None if optimizer is None else optimizer.state_dict(),
        "generator": None if generator is None else generator.get_state(),
        "rng": rng_state() if rng else None,
        "history": _plain(history),
    }
    if isinstance(file, str | os.PathLike):
        atomic_save(payload, file)
    elif hasattr(file, "write"):
        torch.save(payload, file)
    else:
        raise TypeError(
            f"save_checkpoint writes to a path or a binary file object, got {type(file).__name__}"
        )


def load_checkpoint(
    file: str | os.PathLike | BinaryIO, map_location: str | torch.device = "cpu"
) -> dict:
    """Read a checkpoint written by :func:`save_checkpoint` from a path or a binary file object open
    for reading, with PyTorch's safe loader (``weights_only=True``: tensors and plain data, no
    arbitrary code). Returns its dict: ``model``, ``optimizer``, ``step``, ``generator``, ``rng``,
    ``history``, ``config``, ``run`` (``None`` for what was not saved).

    Raises:
        FileNotFoundError: there is no file at ``path``.
        ValueError: the file is not a checkpoint of this package (not a PyTorch file, a truncated
            one, or a model saved with ``GPT.save``), or its format version is not this package's.
        TypeError: ``file`` is neither a path nor a readable file object.
    """
    if isinstance(file, str | os.PathLike):
        path = pathlib.Path(file)
        if not path.is_file():
            raise FileNotFoundError(
                f"no checkpoint at {path}; pass the checkpoint_path a run saved to, or start without "
                "resume_from"
            )
        source: Any = path
    elif hasattr(file, "read"):
        path, source = getattr(file, "name", "the file object"), file
    else:
        raise TypeError(
            f"load_checkpoint reads a path or a binary file object, got {type(file).__name__}"
        )
    try:
        ckpt = torch.load(source, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, EOFError, RuntimeError) as err:
        raise ValueError(
            f"{path} is not a readable checkpoint ({type(err).__name__}: {str(err)[:120]}); it may "
            "be truncated or another kind of file. Pass a file written by train(..., "
            "checkpoint_path=...) or save_checkpoint, or start without resume_from"
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
    diffs = _differences(ckpt["config"], _plain(config), "config")
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
    file: str | os.PathLike | BinaryIO,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    generator: torch.Generator | None = None,
    config: Any = None,
    run: dict | None = None,
    restore_rng: bool = True,
) -> tuple[int, dict | None]:
    """Restore a run from the checkpoint in ``file`` (a path or a binary file object) into ``model``
    and, when given, ``optimizer`` and the batch ``generator``; return ``(step, history)``: the
    loop's next step and the history so far as a dict (``None`` if none was saved).

    With ``config`` (and ``run``) the checkpoint's settings must be the same (:func:`check_same_run`).
    With ``restore_rng=True`` (the default, which makes a resumed run equal the uninterrupted one) the
    process's **global** generators are set to their saved state: PyTorch's on the CPU and on every
    CUDA device, Python's ``random`` and NumPy's. Pass ``restore_rng=False`` to leave them alone, in a
    program whose other parts draw from them too.

    Raises:
        ValueError: see :func:`load_checkpoint`, :func:`check_same_run` and :func:`load_model_state`;
            also when an ``optimizer``, a ``generator`` or ``restore_rng`` asks for a state that the
            checkpoint does not hold.
    """
    ckpt = load_checkpoint(file)
    if config is not None or run is not None:
        check_same_run(ckpt, config, run)
    wanted = {"optimizer": optimizer is not None, "generator": generator is not None,
              "rng": restore_rng}  # fmt: skip
    absent = [k for k, asked in wanted.items() if asked and ckpt.get(k) is None]
    if absent:
        raise ValueError(
            f"the checkpoint holds no {' and no '.join(absent)} state: it was saved without it; "
            "pass None for it (restore_rng=False for the generators' states)"
        )
    load_model_state(model, ckpt["model"])
    if optimizer is not None:
        optimizer.load_state_dict(ckpt["optimizer"])  # moves the moments to the parameters' device
    if generator is not None:
        generator.set_state(ckpt["generator"])
    if restore_rng:
        set_rng_state(ckpt["rng"])
    return int(ckpt["step"]), ckpt["history"]
