# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check's pre-flight: what the engine refuses is refused before any rank starts (exit status 2, one line
with the engine's reason), a misspelled key is named with the key it resembles, and a config the engine accepts
passes ``--preflight`` (exit status 0). In this process: nothing is launched."""

import json

import pytest
import torch

pytestmark = pytest.mark.fork_only

MICRO_4 = {"train_micro_batch_size_per_gpu": 4}
# config, ranks, the line printed (stderr on a refusal, stdout otherwise), exit status
CASES = {
    "gas_0": (dict(MICRO_4, gradient_accumulation_steps=0), 2,
              "gradient_accumulation_steps: 0: a batch size or step count is a whole number of at least 1", 2),
    "gas_negative": (dict(MICRO_4, gradient_accumulation_steps=-2), 2,
                     "gradient_accumulation_steps: -2: a batch size or step count is a whole number of at least 1", 2),
    "batch_mismatch":
    (dict(MICRO_4, train_batch_size=30, gradient_accumulation_steps=4), 2,
     "train_batch_size 30 is not train_micro_batch_size_per_gpu 4 x gradient_accumulation_steps 4 x 2 "
     "data-parallel rank(s) = 32; would work: \"train_batch_size\": 32", 2),
    "misspelled_section": ({
        "zero_optimisation": {
            "stage": 2
        }
    }, 1, "zero_optimisation: unknown; did you mean zero_optimization?", 2),
    "nested_misspelling": ({
        "zero_optimization": {
            "stag": 2
        }
    }, 1, "zero_optimization.stag: unknown; did you mean zero_optimization.stage?", 2),
    "wrong_type": ({
        "zero_optimization": {
            "stage": "two"
        }
    }, 1, "the engine refuses this config: zero_optimization.stage: \"two\": should be 0, 1, 2 or 3", 2),
    "out_of_range": ({
        "zero_optimization": {
            "stage": 7
        }
    }, 1, "zero_optimization.stage: 7: should be 0, 1, 2 or 3", 2),
    # Refused whatever the batch keys: the error does not blame them.
    "bf16_master_on_zero0": ({
        "train_batch_size": 32,
        "bf16": {
            "enabled": True,
            "bf16_master_weights_and_grads": True
        },
        "zero_optimization": {
            "stage": 0
        }
    }, 1, "the engine refuses this config: bf16.bf16_master_weights_and_grads is only supported with ZeRO stage 1", 2),
    "per_item_misspelled": ({
        "loss_normalization": "per-item"
    }, 1, "Invalid loss_normalization: 'per-item'", 2),
    "hf_auto": ({
        "train_micro_batch_size_per_gpu": "auto",
        "zero_optimization": {
            "stage": 2
        }
    }, 1, "train_micro_batch_size_per_gpu: \"auto\" is filled in by the Hugging Face Trainer", 2),
    "unknown_key_far_from_any": ({
        "my_note": "x",
        "zero_optimization": {
            "stage": 1
        }
    }, 1, "note: my_note: not a key DeepSpeed reads; ignored", 0),
    "accepted": ({
        "train_batch_size": 32,
        "bf16": {
            "enabled": True
        },
        "zero_optimization": {
            "stage": 2,
            "reduce_scatter": False
        },
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": 1e-3,
                "betas": [0.9, 0.95]
            }
        }
    }, 2, "ZeRO 2, bf16, optimizer AdamW, reduce_scatter off, gradient_clipping 1.0 (the default), "
                 "loss_normalization mean: the engine accepts it", 0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_preflight(case, tmp_path, capsys):
    from deepspeed.gafix.gas_check.cli import main
    config, ranks, line, status = CASES[case]
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert main(["--config", str(path), "--ranks", str(ranks), "--preflight"]) == status
    out = capsys.readouterr()
    assert line in (out.err if status else out.out), out
    if status:
        assert out.err.count("\n") <= 2 and "Traceback" not in out.err, out.err  # one line each, no traceback


@pytest.mark.skipif(torch.cuda.is_available(), reason="DeepCompile runs here")
def test_deepcompile_is_refused_off_cuda(tmp_path, capsys):
    # ds_gas_check compiles the engine for DeepCompile, whose op builds for CUDA only: one line, not a build error.
    from deepspeed.gafix.gas_check.cli import main
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 1}, "compile": {"deepcompile": True}}))
    assert main(["--config", str(path), "--ranks", "1", "--preflight"]) == 2
    err = capsys.readouterr().err
    assert "compile.deepcompile: DeepCompile runs on CUDA devices only (this accelerator: cpu)" in err, err


def test_a_refused_config_stops_before_any_rank_starts(tmp_path, capsys, monkeypatch):
    from deepspeed.gafix.gas_check import cli
    monkeypatch.setattr(cli, "relaunch", lambda *args: pytest.fail("launched ranks for a config the engine refuses"))
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimisation": {"stage": 2}}))
    assert cli.main(["--config", str(path), "--ranks", "2"]) == 2
    assert "did you mean zero_optimization?" in capsys.readouterr().err


def test_a_config_refused_once_the_optimizer_is_built_exits_2_with_one_line(tmp_path, extensions_dir):
    """per_item with Muon passes the parser; the engine refuses it as it builds the optimizer, on every rank: one
    line, exit status 2 (not 1, a failed split), no traceback."""
    import os
    import subprocess
    import sys
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"loss_normalization": "per_item", "zero_optimization": {"stage": 1}}))
    proc = subprocess.run(
        [sys.executable, "-m", "deepspeed.gafix.gas_check", "--config",
         str(path), "--optimizer", "muon", "--quiet"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, TORCH_EXTENSIONS_DIR=str(extensions_dir)))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("ds_gas_check: error:")]
    assert len(errors) == 1 and "per_item" in errors[0] and "Traceback" not in proc.stderr, proc.stderr[-2000:]


ZERO3_SP = {
    "bf16": {
        "enabled": True
    },
    "gradient_clipping": 1.0,
    "sequence_parallel_size": 2,
    "zero_optimization": {
        "stage": 3,
        "zero_quantized_gradients": False
    },
    "optimizer": {
        "type": "AdamW",
        "params": {
            "lr": 1e-4
        }
    },
}


def test_the_preflight_gives_each_set_key_its_coverage_row(tmp_path, capsys):
    from deepspeed.gafix.gas_check.cli import main
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZERO3_SP))
    assert main(["--config", str(path), "--ranks", "2", "--preflight"]) == 0
    out = capsys.readouterr().out
    assert "map: covered: sequence_parallel_size: Ulysses SP 2" in out
    assert "map: covered: zero_optimization, zero_optimization.stage:" in out
    assert "map: approximate: zero_optimization.zero_quantized_gradients: ZeRO++ qgZ" in out
    assert "optimizer.params" not in out  # an optimizer's own arguments are not engine keys


def test_a_run_tells_only_of_paths_not_checked_against_fp64(tmp_path, capsys, monkeypatch):
    from deepspeed.gafix.gas_check import cli
    launched = []
    monkeypatch.setattr(cli, "relaunch", lambda *args: launched.append(args) or 0)
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(ZERO3_SP))
    cli.main(["--config", str(path), "--ranks", "2"])
    out = capsys.readouterr().out
    assert launched and "map: approximate: zero_optimization.zero_quantized_gradients" in out
    assert "map: covered" not in out


def test_coverage_rows_follow_the_map():
    from deepspeed.gafix.gas_check.preflight import coverage
    rows = [{
        "keys": ["a", "a.b"],
        "status": "covered",
        "note": "n1"
    }, {
        "keys": ["c.*"],
        "status": "open",
        "note": "n2"
    }]
    assert coverage({
        "a": {
            "b": 1
        },
        "c": {
            "d": {
                "e": 2
            }
        },
        "z": 3
    }, rows) == [("covered", ["a", "a.b"], "n1"), ("open", ["c.d", "c.d.e"], "n2")]
