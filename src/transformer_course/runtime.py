"""Seeds, devices, the machine's name, evaluation mode and shapes in messages: shared infrastructure
of every chapter, lab, training run and benchmark.

Library modules never pick a device: they follow their inputs. Only notebooks and scripts call
:func:`default_device`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import os
import pathlib
import platform
import random
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import torch
from torch import nn

__all__ = ["default_device", "eval_mode", "machine", "reusable_run", "seed_everything", "shape_of"]

DEVICE_ENV = "TRANSFORMER_COURSE_DEVICE"
DEVICE_LOG_ENV = "TRANSFORMER_COURSE_DEVICE_LOG"
RUN_STORE_ENV = "TRANSFORMER_COURSE_RUN_STORE"
_fallback_noted = False


def shape_of(t: torch.Tensor) -> str:
    """A tensor's shape as ``(2, 3)``, for error messages that name what they got."""
    return "(" + ", ".join(str(s) for s in t.shape) + ")"


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's and torch's generators (CPU and every GPU) with ``seed``.

    Returns a fresh ``torch.Generator`` seeded with ``seed`` for code that wants to pass
    ``generator=`` explicitly. Global switches (TF32, deterministic algorithms) are left alone.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (seeding the legacy global generator is the point)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return torch.Generator().manual_seed(seed)


def default_device(prefer: str | None = None) -> torch.device:
    """The device a notebook or script should use.

    ``prefer`` (or, when it is ``None``, the environment variable ``TRANSFORMER_COURSE_DEVICE``) may be
    ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; with neither, CUDA is used when available, else the CPU.
    Asking for CUDA on a machine without it raises ``RuntimeError`` saying how to fix it. Falling back
    to the CPU because no GPU is visible prints a one-line note (once per process), so a lab that was
    meant for a GPU runtime says where it runs. When ``TRANSFORMER_COURSE_DEVICE_LOG`` names a file, the
    chosen device is appended to it (the GPU CI uses this to prove the notebooks really ran on CUDA).
    """
    global _fallback_noted
    wanted = prefer if prefer is not None else os.environ.get(DEVICE_ENV) or None
    if wanted is None:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if device.type == "cpu" and not _fallback_noted:
            print(
                "note: no CUDA GPU is visible, so this runs on the CPU (everything works, slower)"
            )
            _fallback_noted = True
    else:
        try:
            device = torch.device(wanted)
        except RuntimeError as err:
            raise ValueError(
                f"unknown device {wanted!r}; use 'cpu', 'cuda' or 'cuda:N'"
                + (f" (from ${DEVICE_ENV})" if prefer is None else "")
            ) from err
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device {wanted!r} was asked for but this torch ({torch.__version__}) sees no CUDA GPU."
                " Use default_device('cpu'), unset $"
                + DEVICE_ENV
                + ", or on Colab pick Runtime > Change runtime type > GPU."
            )
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise RuntimeError(
                f"device {wanted!r} was asked for but only {torch.cuda.device_count()} GPU(s) exist"
            )
    log = os.environ.get(DEVICE_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{device.type}\n")
    return device


def machine(device: torch.device | str = "cpu") -> str:
    """One line naming where a figure was measured: the GPU, or the CPU model and torch's threads.

    Every benchmark and every page that prints a timing uses this line, so figures always say their
    machine (and the torch version that produced them).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            names = [line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads "
        f"(torch {torch.__version__})"
    )


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """Switch ``model`` to evaluation mode (no dropout) and gradients off for the block, then restore
    whatever mode it was in, even when the block raises."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


Run = TypeVar("Run")


@functools.cache
def _package_digest() -> str:
    """A digest of the package's source: a stored run is only reused by the code that made it."""
    h = hashlib.sha256()
    for path in sorted(pathlib.Path(__file__).parent.rglob("*.py")):
        h.update(path.as_posix().encode() + path.read_bytes())
    return h.hexdigest()


@contextlib.contextmanager
def _training_lock(lock: pathlib.Path, poll_s: float = 0.2) -> Iterator[None]:
    """Hold ``lock`` (a file naming this process) for the block; while a live process holds it, wait.
    The lock of a process that has ended is removed and taken."""
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                holder = int(lock.read_text() or 0)
            except (FileNotFoundError, ValueError):
                holder = 0  # released, or not written yet: look again
            if holder and not _alive(holder):
                lock.unlink(missing_ok=True)
            else:
                time.sleep(poll_s)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine."""
    try:
        os.kill(pid, 0)  # PermissionError: it runs, as another user
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def reusable_run(train_fn: Callable[..., Run]) -> Callable[..., Run]:
    """``train_fn``, a seeded training run of the course, made to reuse an identical finished run
    when the environment variable ``TRANSFORMER_COURSE_RUN_STORE`` names a folder.

    ``make test`` sets it (to a folder it empties first), so that a run that a chapter and its lab
    both make, with the same arguments, trains once per test run. Without it (a reader, a learner,
    a benchmark) the function runs as written. A call is identical when the function, its arguments
    with their defaults, torch's version and thread count and the package's source are; and only runs
    on the CPU are stored, where the course's runs repeat bit for bit (``tests/test_runtime.py``
    checks a reused run against a new one). A reused run also leaves Python's, NumPy's and torch's
    random states where the run left them, so the code after the call sees exactly what it would
    have seen. A call made while another process trains the identical run waits for it (a lock file
    names the process; the lock of a process that has ended is taken over), so that the run trains
    once whichever of the two gets there first.
    """
    signature = inspect.signature(train_fn)

    @functools.wraps(train_fn)
    def run(*args, **kwargs) -> Run:
        folder = os.environ.get(RUN_STORE_ENV)
        if not folder:
            return train_fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if torch.device(bound.arguments.get("device", "cpu")).type != "cpu":
            return train_fn(*args, **kwargs)
        described = {
            k: str(torch.device(v)) if k == "device" else v for k, v in bound.arguments.items()
        }
        key = hashlib.sha256(
            repr(
                (train_fn.__qualname__, described, torch.__version__, torch.get_num_threads())
            ).encode()
            + _package_digest().encode()
        ).hexdigest()[:24]
        path = pathlib.Path(folder) / f"{train_fn.__name__}-{key}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        with _training_lock(path.with_name(f"{path.name}.lock")):  # waits for an identical run
            if path.exists():
                stored = torch.load(path, weights_only=False)  # written by this function, below
                random.setstate(stored["python"])
                np.random.set_state(stored["numpy"])  # noqa: NPY002
                torch.set_rng_state(stored["torch"])
                return stored["run"]
            result = train_fn(*args, **kwargs)
            partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
            state = {
                "run": result,
                "python": random.getstate(),
                "numpy": np.random.get_state(),  # noqa: NPY002
                "torch": torch.get_rng_state(),
            }
            torch.save(state, partial)
            os.replace(partial, path)  # another process sees the whole file or none
            return result

    return run
