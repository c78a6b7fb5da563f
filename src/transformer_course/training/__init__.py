"""Training: the objective, AdamW, clipping, initialisation, gradient noise, data parallelism and a
small scaling-law fit.

Chapter: *Training* (Turner 2023 sec. 5 sets training aside as standard; Dramko 2025 sec. 5.2 on
teacher forcing; Kingma & Ba 2015; Loshchilov & Hutter 2019; Radford et al. 2019 on the residual
initialisation; McCandlish et al. 2018 on the gradient noise scale; Li et al. 2020 on PyTorch's
DistributedDataParallel; Kaplan et al. 2020 and Hoffmann et al. 2022 on scaling laws). The loop
itself, its schedule :func:`.train.lr_at`, gradient accumulation and its data-parallel mode are shared
infrastructure in :mod:`.train`, and saving and resuming a run in :mod:`.checkpoint`; this subpackage
holds the equations the chapter derives, one file per part, each checked in
``tests/test_training.py``: against PyTorch where it has the same thing (the cross-entropy, Adam
and AdamW, clipping, forward hooks for the residual stream, its FLOP counter and allocations for the
cost of a step, bfloat16 arithmetic for the rounding), and otherwise against a loop or synthetic data
with a known answer (the noise scale, the scaling and IsoFLOP fits):

* :mod:`.objective`: the cross-entropy and a log-sum-exp that does not overflow;
* :mod:`.optim`: Adam, AdamW, Adam with an L2 penalty, clipping by the global norm;
* :mod:`.residual`: the residual stream at initialisation;
* :mod:`.noise`: per-example gradients and the gradient noise scale;
* :mod:`.learning_rate`: the recipe of the instability runs and a learning-rate sweep over widths;
* :mod:`.scaling`: power laws in the model size, the recipe of a scaling study, the minimum of a
  parabola in a log axis;
* :mod:`.precision`: the updates a low-precision weight cannot take;
* :mod:`.accounting`: memory and FLOPs of a training step, derived and measured;
* :mod:`.isoflop`: the compute-optimal model size, from IsoFLOP profiles and a loss surface;
* :mod:`.ddp`: the data-parallel demonstration, also the command line
  ``python -m transformer_course.training ddp-demo`` (:mod:`.__main__`).
"""

from __future__ import annotations

from .accounting import (
    counted_flops,
    gpt_params,
    matmul_params,
    peak_step_memory,
    saved_activation_bytes,
    step_flops,
    step_memory,
)
from .ddp import DEMO_TEXT, ddp_demo, launch_ddp_demo, main
from .isoflop import (
    LossSurface,
    fit_frontier,
    fit_loss_surface,
    isoflop_minima,
    isoflop_profiles,
)
from .learning_rate import (
    INSTABILITY_RECIPE,
    LR_GRID,
    LR_SWEEP_STEPS,
    LR_SWEEP_WIDTHS,
    best_learning_rate,
    lr_sweep,
    lr_sweep_recipe,
)
from .noise import NoiseScale, gradient_noise_scale, noise_scale_two_batch, per_example_grads
from .objective import cross_entropy, logsumexp
from .optim import adam_l2_step, adamw_step, clip_by_global_norm
from .precision import SIGNIFICAND_BITS, update_rounded_away
from .residual import residual_stream_rms
from .scaling import (
    LogParabola,
    PowerLaw,
    fit_power_law,
    log_parabola_minimum,
    scaled_recipe,
    scaling_analysis,
)

__all__ = [
    "DEMO_TEXT",
    "INSTABILITY_RECIPE",
    "LR_GRID",
    "LR_SWEEP_STEPS",
    "LR_SWEEP_WIDTHS",
    "SIGNIFICAND_BITS",
    "LogParabola",
    "LossSurface",
    "NoiseScale",
    "PowerLaw",
    "adam_l2_step",
    "adamw_step",
    "best_learning_rate",
    "clip_by_global_norm",
    "counted_flops",
    "cross_entropy",
    "ddp_demo",
    "fit_frontier",
    "fit_loss_surface",
    "fit_power_law",
    "gpt_params",
    "gradient_noise_scale",
    "isoflop_minima",
    "isoflop_profiles",
    "launch_ddp_demo",
    "log_parabola_minimum",
    "logsumexp",
    "lr_sweep",
    "lr_sweep_recipe",
    "main",
    "matmul_params",
    "noise_scale_two_batch",
    "peak_step_memory",
    "per_example_grads",
    "residual_stream_rms",
    "saved_activation_bytes",
    "scaled_recipe",
    "scaling_analysis",
    "step_flops",
    "step_memory",
    "update_rounded_away",
]
