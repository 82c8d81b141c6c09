# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_gas_check on the user's own model and data: a Hugging Face causal LM from a local directory,
a small transformer from ``--model/--data/--loss`` factories, the plot, progress, and bad input.

Each command launches 2 CPU ranks itself (``--ranks 2``), as a user would run it.
"""

import json
import sys

import pytest

from helpers.gas_check_cli import ds_gas_check
from helpers.repo import REPO

pytestmark = pytest.mark.fork_only

# No accumulation and the most (CI's 30 minutes: the splits between add nothing the two do not check).
SPLITS = ["--splits", "4x1,1x4", "--steps", "2"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_config(path, **config):
    path.write_text(json.dumps(config))
    return str(path)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A 2-layer Llama with weights, saved as a local Hugging Face directory (nothing fetched)."""
    transformers = pytest.importorskip("transformers")
    import torch
    directory = tmp_path_factory.mktemp("tiny-llama")
    config = transformers.LlamaConfig(vocab_size=64,
                                      hidden_size=32,
                                      intermediate_size=64,
                                      num_hidden_layers=2,
                                      num_attention_heads=4,
                                      num_key_value_heads=2,
                                      max_position_embeddings=64)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(str(directory))
    return directory


def test_hf_model_passes_with_table_plot_and_progress(tmp_path, tiny_llama, extensions_dir):
    results, plot = tmp_path / "results.json", tmp_path / "check.png"
    config = write_config(tmp_path / "ds.json", zero_optimization={"stage": 2}, bf16={"enabled": True})
    proc = ds_gas_check([
        "--config", config, "--hf-model",
        str(tiny_llama), "--ranks", "2", *SPLITS, "--json",
        str(results), "--plot",
        str(plot)
    ], extensions_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"model {tiny_llama}, ZeRO 2, bf16" in proc.stdout
    assert "split (micro x GAS x ranks)" in proc.stdout
    rows = json.loads(results.read_text())
    assert [(r["name"], r["passed"]) for r in rows] == [("4 x 1 x 2", True), ("1 x 4 x 2", True)]
    # Variable lengths with padding masked: per-micro-batch token means differ from the global one, and
    # the check says so (the data really has varying item counts).
    assert all(r["loss_normalization_gap"] > 1e-3 for r in rows[1:])
    assert "the loss is a mean over each micro-batch's own items" in proc.stdout
    assert plot.read_bytes()[:8] == PNG_MAGIC
    # Progress: one line per step of each split on stderr (not a terminal), from rank 0 only.
    progress = [line for line in proc.stderr.splitlines() if line.startswith("ds_gas_check: [")]
    assert [line.split("] ", 1)[1].split(",")[0] for line in progress
            ] == [f"split {split}: step {step}/2" for split in ("4 x 1 x 2", "1 x 4 x 2") for step in (1, 2)]


def test_hf_model_without_reference_zero3(tmp_path, tiny_llama, extensions_dir):
    """--no-reference on padded token batches, ZeRO-3: the 1 x 4 split is compared
    with its own micro-batches trained without accumulation, and passes (compared with the 4 x 1 split, whose
    micro-batch token means differ by design, a correct engine used to fail)."""
    results = tmp_path / "results.json"
    config = write_config(tmp_path / "ds.json", zero_optimization={"stage": 3}, gradient_clipping=1.0)
    proc = ds_gas_check([
        "--config", config, "--hf-model",
        str(tiny_llama), "--ranks", "2", *SPLITS, "--no-reference", "--json",
        str(results)
    ], extensions_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(results.read_text())
    assert [(r["name"], r["verdict"], r["compared_with"])
            for r in rows] == [("4 x 1 x 2", "PASS", "itself"),
                               ("1 x 4 x 2", "PASS", "the same micro-batches without accumulation")]
    assert 0 < rows[1]["update_errors"][0] < 1e-5
    assert "likely cause" not in proc.stdout


def test_own_transformer_factories_pass_with_adam(tmp_path, extensions_dir):
    """--model/--data/--loss; AdamW in fp32, whose update rounding the tolerance has to model.

    One rank, in the command's own process (tests/test_gas_check.py runs user factories on 2 ranks).
    """
    results = tmp_path / "results.json"
    config = write_config(tmp_path / "ds.json",
                          zero_optimization={"stage": 1},
                          gradient_clipping=1.0,
                          optimizer={
                              "type": "AdamW",
                              "params": {
                                  "lr": 1e-3,
                                  "torch_adam": True
                              }
                          })
    proc = ds_gas_check([
        "--config", config, "--model", "gas_check_transformer:make_model", "--data",
        "gas_check_transformer:make_batches", "--loss", "gas_check_transformer:token_loss", *SPLITS, "--json",
        str(results), "--quiet"
    ],
                        extensions_dir,
                        cwd=REPO / "examples")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads(results.read_text())
    assert all(r["passed"] for r in rows), proc.stdout
    # The tolerance came from this model's own rounding, and stayed well below what a dropped micro-batch does.
    assert all(1e-5 < r["tolerance"] <= 2e-2 for r in rows), [r["tolerance"] for r in rows]
    assert not any(line.startswith("ds_gas_check: [") for line in proc.stderr.splitlines()), "--quiet"


@pytest.mark.parametrize("args, message", [
    (["--hf-model", "{tmp}"], "--hf-model {tmp}: no config.json there"),
    (["--data", "gas_check_transformer:make_batches"], "--data needs --model"),
    (["--model", "gas_check_transformer:make_model", "--data", "gas_check_transformer:nothing"
      ], "--data 'gas_check_transformer:nothing': module 'gas_check_transformer' has no attribute 'nothing'"),
    (["--loss", "gas_check_transformer:token_loss"], "--loss needs --data"),
    (["--splits", "4x1,3x2"], "--splits '4x1,3x2': micro-batch x GAS must be the same in every split"),
    (["--hf-model", "{tmp}", "--zero-init"], "--hf-model and --zero-init: not yet"),
])
def test_bad_input_names_the_option(tmp_path, capsys, monkeypatch, args, message):
    # In this process: every such error is found before deepspeed is initialized.
    from deepspeed.gafix.gas_check.cli import main
    monkeypatch.chdir(REPO / "examples")
    monkeypatch.setattr(sys, "path", list(sys.path))  # the checker puts the working directory on it
    config = write_config(tmp_path / "ds.json")
    assert main(["--config", config, *[a.format(tmp=tmp_path) for a in args]]) == 2
    assert f"ds_gas_check: error: {message.format(tmp=tmp_path)}" in capsys.readouterr().err
