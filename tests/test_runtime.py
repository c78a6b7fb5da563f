"""Seeds, devices and the name of the machine."""

from __future__ import annotations

import pathlib
import random
import sys

import numpy as np
import pytest
import torch

from transformer_course import runtime
from transformer_course.runtime import default_device, seed_everything


def test_seed_everything_repeats_all_generators():
    g1 = seed_everything(123)
    a = (random.random(), np.random.rand(), torch.rand(3), torch.rand(2, generator=g1))  # noqa: NPY002
    g2 = seed_everything(123)
    b = (random.random(), np.random.rand(), torch.rand(3), torch.rand(2, generator=g2))  # noqa: NPY002
    assert a[0] == b[0] and a[1] == b[1]
    assert torch.equal(a[2], b[2]) and torch.equal(a[3], b[3])


def test_seed_must_be_int():
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(1.5)


def test_default_device(monkeypatch, tmp_path):
    monkeypatch.delenv("TRANSFORMER_COURSE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert default_device().type == expected
    assert default_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("TRANSFORMER_COURSE_DEVICE", "cpu")
    log = tmp_path / "devices.log"
    monkeypatch.setenv("TRANSFORMER_COURSE_DEVICE_LOG", str(log))
    assert default_device() == torch.device("cpu")
    assert log.read_text() == "cpu\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_gpu_explains(monkeypatch):
    with pytest.raises(RuntimeError, match=r"sees no CUDA GPU.*Change runtime type"):
        default_device("cuda")
    monkeypatch.setenv("TRANSFORMER_COURSE_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="sees no CUDA GPU"):
        default_device()


def test_unknown_device_explains():
    with pytest.raises(ValueError, match="unknown device 'gpu'"):
        default_device("gpu")


def test_machine_names_the_cpu_threads_and_torch():
    line = runtime.machine("cpu")
    assert f"{torch.get_num_threads()} torch threads" in line and torch.__version__ in line
    with open("/proc/cpuinfo", encoding="utf-8") as fh:
        model = next(
            (ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), None
        )
    if model:
        assert line.startswith(model)


def test_a_lab_falls_back_to_the_cpu_with_a_note_when_no_gpu_is_visible(tmp_path):
    """Lab 0 with every GPU hidden: it runs, on the CPU, and says so; the device log records 'cpu'."""
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    log = tmp_path / "devices.log"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRANSFORMER_COURSE_DEVICE_LOG": str(log)}
    env.pop("TRANSFORMER_COURSE_DEVICE", None)
    out = tmp_path / "lab.ipynb"
    code = (
        "import sys, nbformat; from nbclient import NotebookClient; "
        "nb = nbformat.read(sys.argv[1], as_version=4); "
        "NotebookClient(nb, timeout=300, kernel_name='python3').execute(); "
        "nbformat.write(nb, sys.argv[2])"
    )
    lab = str(root / "notebooks" / "00_notation.ipynb")
    done = subprocess.run(
        [sys.executable, "-c", code, lab, str(out)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    text = json.dumps(json.loads(out.read_text()))
    assert "no CUDA GPU is visible, so this runs on the CPU" in text
    assert log.read_text().split() == ["cpu"]
    checker = [
        sys.executable,
        str(root / "scripts" / "check_device_log.py"),
        str(log),
        str(root / "notebooks"),
    ]
    refused = subprocess.run(checker, capture_output=True, text=True)
    assert (
        refused.returncode == 1 and "were 'cpu', not 'cuda'" in refused.stdout
    )  # the GPU CI's check


def _states() -> tuple:
    return random.getstate(), np.random.get_state()[1].tolist(), torch.get_rng_state()  # noqa: NPY002


def test_a_reused_run_is_the_run_a_new_call_makes(monkeypatch, tmp_path):
    """``reusable_run``: with the store set, an identical call returns the stored run instead of
    training again, and the run and the random states after it are bit for bit those of a new run;
    another argument, a GPU or no store trains anew."""
    import dataclasses

    from transformer_course.vision import DIGITS_RECIPE, train_digits

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "scripts"))
    import run_tests  # make test's runner names the variable without importing the package

    assert run_tests.RUN_STORE_ENV == runtime.RUN_STORE_ENV
    monkeypatch.delenv(runtime.RUN_STORE_ENV, raising=False)
    new = train_digits(DIGITS_RECIPE, steps=4, seed=1)  # no store: runs as written
    after_new = _states()
    assert not list(tmp_path.iterdir())

    monkeypatch.setenv(runtime.RUN_STORE_ENV, str(tmp_path))
    first = train_digits(DIGITS_RECIPE, steps=4, seed=1)
    assert len(list(tmp_path.glob("train_digits-*.pt"))) == 1
    torch.manual_seed(123)  # the global state is not what the stored run left
    reused = train_digits(DIGITS_RECIPE, "cpu", 4, 1)  # the same call, written another way
    assert len(list(tmp_path.glob("train_digits-*.pt"))) == 1
    assert reused is not first  # read back from the file
    for run in (first, reused):
        assert dataclasses.replace(run.history, seconds=0) == dataclasses.replace(
            new.history, seconds=0
        )
        assert run.history.seconds == first.history.seconds  # the time the stored run took
        assert run.test_accuracy == new.test_accuracy
        trained, again = run.model.state_dict(), new.model.state_dict()
        assert trained.keys() == again.keys()
        assert all(torch.equal(trained[k], again[k]) for k in trained)
    after = _states()
    assert (
        after[0] == after_new[0]
        and after[1] == after_new[1]
        and torch.equal(after[2], after_new[2])
    )

    train_digits(DIGITS_RECIPE, steps=4, seed=2)  # another seed: another run
    assert len(list(tmp_path.glob("train_digits-*.pt"))) == 2
    if torch.cuda.is_available():  # only CPU runs are stored
        train_digits(DIGITS_RECIPE, "cuda", steps=4, seed=1)
        assert len(list(tmp_path.glob("train_digits-*.pt"))) == 2


def test_a_call_waits_for_an_identical_run_in_progress_and_takes_over_a_dead_ones_lock(
    monkeypatch, tmp_path
):
    """While the lock of an identical run is held by a live process, ``reusable_run`` waits and then
    returns the stored run (it does not train it again); the lock of a process that has ended does
    not hold it up."""
    import shutil
    import subprocess
    import threading
    import time

    from transformer_course.vision import DIGITS_RECIPE, train_digits

    made = tmp_path / "made"
    monkeypatch.setenv(runtime.RUN_STORE_ENV, str(made))
    first = train_digits(DIGITS_RECIPE, steps=2, seed=3)
    (stored,) = made.glob("train_digits-*.pt")

    store = tmp_path / "store"
    store.mkdir()
    monkeypatch.setenv(runtime.RUN_STORE_ENV, str(store))
    lock = store / f"{stored.name}.lock"

    def another_process_trains() -> None:  # holds the lock (as this live process), then stores
        with runtime._training_lock(lock):
            time.sleep(0.6)
            shutil.copy(stored, store / stored.name)

    holder = threading.Thread(target=another_process_trains)
    holder.start()
    while not lock.exists():
        time.sleep(0.01)
    start = time.perf_counter()
    waited = train_digits(DIGITS_RECIPE, steps=2, seed=3)
    seconds = time.perf_counter() - start
    holder.join()
    assert seconds > 0.4  # it waited for the holder
    assert waited.history == first.history  # the stored run, its training time included
    assert not lock.exists()

    (store / stored.name).unlink()
    ended = subprocess.Popen(["true"])
    ended.wait()
    lock.write_text(str(ended.pid))  # the lock of a process that has ended
    again = train_digits(DIGITS_RECIPE, steps=2, seed=3)  # trains: nothing stored
    assert again.history.train_loss == first.history.train_loss
    assert (store / stored.name).exists() and not lock.exists()
