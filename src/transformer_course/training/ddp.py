"""Data parallelism: the chapter's demonstration run, in one process or in several under ``torchrun``
(book eq. ``eq-train-ddp``; Li et al. 2020 on PyTorch's DistributedDataParallel). Part of chapter
*Training* (:mod:`transformer_course.training`). The loop's data-parallel mode itself is shared
infrastructure in :mod:`transformer_course.train`.

Run as a script, it is the launcher of the demonstration::

    torchrun --standalone --nproc_per_node 2 -m transformer_course.training ddp-demo --out run.json
    python -m transformer_course.training ddp-demo --out run.json     # one process, same global batch

(:func:`launch_ddp_demo` runs the first from Python.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from ..data import get_batch
from ..language_models import GPT, TINY
from ..tokens import CharTokenizer
from ..train import TrainConfig, train
from .objective import cross_entropy

DEMO_TEXT = (
    "to be, or not to be, that is the question: whether 'tis nobler in the mind to suffer the "
    "slings and arrows of outrageous fortune, or to take arms against a sea of troubles. "
) * 20
"""The demonstration's corpus: a short text repeated, learnable in a few steps, with no download."""


def ddp_demo(steps: int = 20, batch_size: int = 16, dtype: str = "float32", seed: int = 0) -> dict:
    """Train a ``TINY`` GPT on :data:`DEMO_TEXT` with the course's loop, :func:`.train.train`, in
    this process: one rank of a ``torch.distributed`` group when one is initialised (the loop then
    wraps the model in DDP and trains each rank on its share of the global batch), otherwise alone
    on the whole global batch. The loss is :func:`cross_entropy` in the model's ``dtype``.

    Returns:
        ``{"losses", "grad_norms", "val_losses", "world_size", "replicas_identical",
        "replica_max_diff", ...}``: the training loss of the global batch and its gradient norm at
        every step, the loss on a held-out batch at the middle and the end, and a comparison of every
        rank's final parameters with rank 0's (bit for bit, then the largest difference).
    """
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    ranks = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        if dist.is_initialized() and dist.get_backend() == "nccl"
        else torch.device("cpu")
    )
    tok = CharTokenizer.from_text(DEMO_TEXT)
    ids = tok.encode_tensor(DEMO_TEXT)
    torch.manual_seed(seed)  # the same initial weights on every rank (DDP broadcasts rank 0's too)
    model = GPT(dataclasses.replace(TINY, vocab_size=tok.vocab_size)).to(device, dt)
    C = model.config.block_size
    cfg = TrainConfig(
        max_steps=steps, lr=3e-3, warmup_steps=5, eval_interval=max(1, steps // 2), seed=seed,
        time_budget_s=3600.0,  # never reached; under DDP the ranks agree on it every step
    )  # fmt: skip
    held_out = get_batch(ids, C, 8, torch.Generator().manual_seed(seed + 1), device)

    def loss_fn(m: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return cross_entropy(m(x)[0], y)  # in the model's dtype (GPT's own loss is float32)

    def evaluate(m: nn.Module) -> dict[str, float]:  # every rank, on its own replica
        return {"val_loss": loss_fn(m, held_out).item()}

    hist = train(
        model,
        lambda g: get_batch(ids, C, batch_size, g, device),
        loss_fn,
        cfg,
        evaluate,
        progress=False,
        scored=lambda batch: batch[1].numel(),  # full windows: every target is scored
    )
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    identical, max_diff = True, 0.0
    if ranks[1] > 1:
        copies = [torch.empty_like(flat) for _ in range(ranks[1])]
        dist.all_gather(copies, flat)
        identical = all(torch.equal(c, copies[0]) for c in copies)
        max_diff = max(float((c - copies[0]).abs().max()) for c in copies)
    return {
        "losses": hist.train_loss,
        "grad_norms": hist.grad_norm,
        "val_losses": hist.evals["val_loss"],
        "world_size": ranks[1],
        "replicas_identical": identical,
        "replica_max_diff": max_diff,
        "dtype": dtype,
        "global_batch": batch_size,
    }


def is_connection_failure(message: str | None) -> bool:
    """Whether a run failed while gloo connected its ranks to each other (``connectFullMesh``: seen on a
    loaded machine over the loopback interface, before any computation): worth one more try, unlike an
    error of the computation itself."""
    return "Gloo connectFullMesh failed" in (message or "")


def launch_ddp_demo(
    nproc: int = 2,
    steps: int = 20,
    batch_size: int = 16,
    dtype: str = "float32",
    seed: int = 0,
    timeout: float = 300.0,
) -> dict:
    """Run :func:`ddp_demo` in ``nproc`` CPU processes under ``torchrun`` (gloo), one torch thread
    each, and return rank 0's result (see :func:`ddp_demo`) with the command line under ``"command"``.

    A run whose ranks could not connect (:func:`is_connection_failure`) is started once more.

    Raises:
        RuntimeError: torchrun failed; the message ends with its error output.
    """
    with tempfile.TemporaryDirectory() as folder:
        out = pathlib.Path(folder) / "ddp_demo.json"
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", "-m", "transformer_course.training", "ddp-demo",
            "--steps", str(steps), "--batch-size", str(batch_size), "--dtype", dtype,
            "--seed", str(seed), "--out", str(out),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore::RuntimeWarning"}
        for _ in range(2):  # one retry when gloo's connections between the ranks drop
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
            if (done.returncode == 0 and out.exists()) or not is_connection_failure(done.stderr):
                break
        if done.returncode != 0 or not out.exists():
            raise RuntimeError(
                f"torchrun exited with {done.returncode}:\n{(done.stderr or done.stdout)[-3000:]}"
            )
        result = json.loads(out.read_text())
    shown = ["torchrun", *command[3:]]  # python -m torch.distributed.run is torchrun
    return {**result, "command": " ".join([*shown[:-2], "--out", "run.json"])}


def main(argv: Sequence[str] | None = None) -> None:
    """Command line: ``ddp-demo`` runs :func:`ddp_demo` (in every process torchrun starts) and writes
    rank 0's result as JSON to ``--out``."""
    parser = argparse.ArgumentParser(prog="python -m transformer_course.training")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("ddp-demo", help="the chapter's data-parallel demonstration")
    demo.add_argument("--steps", type=int, default=20)
    demo.add_argument("--batch-size", type=int, default=16, help="the global batch")
    demo.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--out", type=pathlib.Path, required=True)
    args = parser.parse_args(argv)
    launched = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # started by torchrun
    if launched:
        backend = (
            "nccl" if torch.cuda.is_available() and os.environ.get("DDP_DEMO_CUDA") else "gloo"
        )
        dist.init_process_group(backend)
    try:
        result = ddp_demo(args.steps, args.batch_size, args.dtype, args.seed)
        if not launched or dist.get_rank() == 0:
            args.out.write_text(json.dumps(result))
    finally:
        if launched:
            dist.destroy_process_group()
