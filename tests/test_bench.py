"""The benchmark scripts run end to end and end with one JSON line holding their targets' keys.

Only the plumbing is tested here, with a handful of steps; the figures themselves are measured by
`make bench` on an idle machine (timing is never part of the test suite)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

import transformer_course as tc
from transformer_course import data
from transformer_course.vision import ABLATIONS

ROOT = pathlib.Path(__file__).resolve().parents[1]


def run_bench(script: str, *args: str, subprocess_: bool = False) -> tuple[dict, str]:
    """Run ``bench/<script>`` with ``args`` as ``python bench/<script>`` would, in this process (the
    interpreter and torch are already started: most of a short run's time otherwise), or in a new
    Python with ``subprocess_=True``; check its last line, and return it parsed with what it printed."""
    if subprocess_:
        done = subprocess.run(
            [sys.executable, str(ROOT / "bench" / script), *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        printed = done.stdout
    else:
        printed = _run_in_process(ROOT / "bench" / script, args)
    result = json.loads(printed.strip().splitlines()[-1])  # the last line is one JSON object
    for key in ("targets", "machine", "commit", "date", "device", "load_average_1_5_15min"):
        assert key in result, f"{script}: no {key!r} in {result}"
    for key, (op, _) in result["targets"].items():
        assert key in result and op in ("<=", ">=", "=="), (script, key)
    return result, printed


def _run_in_process(path: pathlib.Path, args: tuple[str, ...]) -> str:
    """The script as ``__main__`` with ``sys.argv`` set, its output captured; what a script may change
    for the whole process (the argument list, the import path, torch's thread count, the working
    folder) is put back afterwards."""
    import contextlib
    import io
    import runpy

    import torch

    saved = (list(sys.argv), list(sys.path), torch.get_num_threads(), os.getcwd())
    out = io.StringIO()
    sys.argv, sys.path = [str(path), *args], [str(path.parent), *sys.path]
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(str(path), run_name="__main__")
    except SystemExit as stop:
        assert stop.code in (None, 0), (
            f"{path.name} exited with {stop.code}:\n{out.getvalue()[-2000:]}"
        )
    finally:
        sys.argv, sys.path = saved[0], saved[1]
        torch.set_num_threads(saved[2])
        os.chdir(saved[3])
    return out.getvalue()


def test_attention_bench():
    """Also as a script, in a new Python (the other benches run in this process)."""
    r, _ = run_bench(
        "attention.py", "--repeats", "2", "--B", "2", "--N", "16", "--D", "32", "--H", "4",
        subprocess_=True,
    )  # fmt: skip
    assert r["mhsa_vs_torch_ratio"] > 0


def test_seq2seq_bench():
    r, _ = run_bench("seq2seq.py", "--steps", "3", "--test", "20")
    assert 0 <= r["exact_match"] <= 1 and r["steps"] == 3


def test_the_ablations_the_makefile_runs_are_the_package_s():
    printed = _run_in_process(ROOT / "bench" / "vit_digits.py", ("--list-ablations",))
    assert printed.split() == ["none", *ABLATIONS]


@pytest.mark.parametrize("ablate", ["none", *ABLATIONS])
def test_vit_bench_and_its_ablations(ablate):
    r, printed = run_bench("vit_digits.py", "--steps", "3", "--ablate", ablate)
    assert 0 <= r["test_accuracy"] <= 1 and r["steps"] == 3
    assert r["ablation"].startswith("none") == (ablate == "none")
    model_line = next(line for line in printed.splitlines() if line.startswith("model: "))
    assert ("patch_init='gpt2'" in model_line) == (ablate == "init"), model_line
    assert ("patch_stride=2" in model_line) == (ablate != "overlap"), model_line


def test_lm_bench():
    try:
        data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")
    r, _ = run_bench("lm.py", "--steps", "3", "--eval-batches", "2", "--new-tokens", "20")
    assert r["kv_identical"] is True and r["steps"] == 3 and r["val_loss"] > 0
    assert r["fitted_seconds"] is None  # --steps runs the recipe as it is


def test_lm_bench_fits_the_recipe_to_a_time():
    needs_corpus()
    r, printed = run_bench(
        "lm.py",
        *("--preset", "minute", "--seconds", "5", "--eval-batches", "2", "--new-tokens", "20"),
    )
    fitted = r["train_settings"]
    assert r["fitted_seconds"] == 5 and "fitted to 5 s" in printed
    assert fitted["max_steps"] == fitted["eval_interval"] >= 10
    assert fitted["time_budget_s"] == pytest.approx(5 - r["probed_ms_per_step"] / 1e3, abs=1e-3)
    assert r["targets"]["train_seconds"] == ["<=", 5] and "val_loss" not in r["targets"]  # a study


def test_lm_bench_refuses_to_fit_a_shortened_run():
    with pytest.raises(AssertionError, match="exited with 2"):  # argparse's error status
        run_bench("lm.py", "--steps", "3", "--seconds", "5")


def test_lm_bench_reads_settings_as_python_values_and_names_a_wrong_one():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import lm
    finally:
        sys.path.remove(str(ROOT / "bench"))
    cfg = tc.train.TrainConfig()
    got = lm.settings(
        "--train", ["lr=1e-2", "betas=(0.9, 0.95)", "min_lr=None", "autocast=bfloat16"], cfg
    )
    assert got == {"lr": 1e-2, "betas": (0.9, 0.95), "min_lr": None, "autocast": "bfloat16"}
    assert lm.settings("--model", ["tie_weights=False"], tc.language_models.TINY) == {
        "tie_weights": False
    }
    wrong = (["learning_rate=1e-2"], ["lr"], ["lr=1e-2x"], ["lr=True"], ["max_steps=many"])
    for items in wrong:
        with pytest.raises(SystemExit, match="--train"):
            lm.settings("--train", items, cfg)
    for items in (["tie_weights=false"], ["vocab_size=80"]):  # text for a truth value; refused
        with pytest.raises(SystemExit, match="--model"):
            lm.settings("--model", items, tc.language_models.TINY, refused=("vocab_size",))


def test_decode_bench():
    pytest.importorskip("transformers", reason="the bench extra: pip install -e '.[bench]'")
    r, _ = run_bench(
        "decode.py",
        *("--layers", "1", "--new-tokens", "8", "--repeats", "1", "--batches", "2"),
        *("--sweep-tokens", "4", "--train-repeats", "1"),
    )
    assert r["identical"] is True and set(r["by_batch"]) == {"2"}
    assert r["speed_vs_hf"] > 0 and r["bound_ratio"] > 0 and r["train_speed_vs_nanogpt"] > 0
    profile = r["profile_per_token"]
    assert profile["ops"] and sum(op["us_per_token"] for op in profile["ops"]) > 0
    assert profile["ms_per_token_in_ops"] > 0 and r["by_batch"]["2"]["hf_cached_tokens_per_s"] > 0


def needs_corpus():
    try:
        data.tinyshakespeare_path(download=False)
    except FileNotFoundError:
        pytest.skip("no local copy of tiny-shakespeare (set TRANSFORMER_COURSE_DATA)")


def test_scaling_bench_quick():
    needs_corpus()
    result, _ = run_bench("scaling.py", "--quick", "--threads", "1")
    assert result["quick"] and len(result["runs"]) == 4 and len(result["fits"]) == 1
    assert all(
        r["val_loss"] > 0 and r["flops"] == 6 * r["params"] * r["tokens"] for r in result["runs"]
    )


def test_scaling_refit_fits_the_recorded_runs_again_and_changes_nothing_else():
    recorded = tc.results.load(ROOT, "cpu")["scaling"].data
    result, printed = run_bench("scaling.py", "--refit")
    assert f"refitting the {len(recorded['runs'])} runs recorded at" in printed
    derived = ("fits", "held_out", "interpolation_error_abs", "refit")

    def measured(study: dict) -> dict:  # the runs, their commit, date and machine
        return {k: v for k, v in study.items() if k not in derived}

    assert measured(result) == measured(recorded)
    again = tc.training.scaling_analysis(recorded["runs"])
    assert result["fits"] == {str(k): v for k, v in again["fits"].items()}
    assert result["held_out"] == again["held_out"]
    assert set(result["refit"]) == {"commit", "date"}


def test_claims_bench_quick():
    needs_corpus()
    result, _ = run_bench("claims.py", "--quick", "--threads", "1")
    assert "total_seconds" in result
    assert set(result["claims"]) == set(tc.claims.CLAIMS) and result["steps"] == 2
    for claim in result["claims"].values():
        assert {r["seed"] for r in tc.claims.ClaimResult.from_json(claim).to_json()["runs"]} == {
            0,
            1,
        }


def test_modern_bench_quick():
    needs_corpus()
    result, _ = run_bench("modern.py", "--quick", "--threads", "1")
    assert "diff_mean" in result and "runs" in result
    assert [run["steps"] for run in result["runs"]["gpt"]] == [3]
    assert result["modern_kv_identical"] is True


def test_length_bench_quick():
    needs_corpus()
    result, _ = run_bench("length.py", "--quick", "--threads", "1")
    schemes = tc.claims.ClaimResult.from_json(result["length"]).variants
    assert {"sinusoidal", "learned", "rope", "alibi"} <= set(schemes)
    assert result["seeds"] == [0, 1] and result["factor"] * result["training_length"] > 0


def test_mae_digits_bench_quick():
    result, _ = run_bench("mae_digits.py", "--quick", "--threads", "1")
    assert result["quick"] and result["seeds"] == [0, 1] and len(result["per_seed"]) == 2
    assert len(result["mae_minus_vit"]) == 3 and 0 < result["raw_pixel_probe"] <= 1


def test_mlm_bench_quick():
    needs_corpus()
    result, _ = run_bench("mlm.py", "--steps", "3", "--windows", "64", "--threads", "1")
    assert result["steps"] == 3 and result["windows"] == 64  # (a 3-step run meets no target)
    assert set(result["mlm_nll_by_right"]) >= {"0"} and result["gpt_nll"] > 0


def test_bpe_bench_quick():
    needs_corpus()
    result, printed = run_bench("bpe.py", "--quick")
    assert result["merges"] == 30 and result["characters"] == 20_000
    assert result["merges_identical"] is True  # the fast trainer learns the recount's merges
    assert result["recount_seconds"] > 0 and result["fast_seconds"] > 0
    assert "recount (train_reference)" in printed


def test_lr_sweep_bench_quick():
    needs_corpus()
    result, _ = run_bench("lr_sweep.py", "--quick", "--threads", "1")
    assert result["quick"] and len(result["runs"]) == 2 * 3 and set(result["best"]) == {"16", "32"}
    for best in result["best"].values():
        assert best["grid_lr"] in result["lrs"] and best["params"] > 0
