# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""A checkpoint file cannot run code when DeepSpeed loads it, and a damaged one is named, not loaded.

2 CPU ranks write clean checkpoints of several configurations (tests/workers/checkpoint_swap.py). Every file of
them loads with DeepSpeed's safe loader, deep-equal to an unchecked load: the allowlist holds what DeepSpeed writes.
Then copies get one extra object each, in one file, which creates a marker directory when unpickled: in the model
states, in rank 1's optimizer states, in a pipeline layer file, in a universal checkpoint's fragment. Every loader
must refuse the file, naming it, before the marker exists: load_checkpoint on the ranks that wrote it, resharded onto
1 rank with checkpoint.reshard_on_load, the universal load, zero_to_fp32 (as a module and as the copy in the
checkpoint directory), ds_to_universal, and an inference v2 checkpoint's model config. 0.19.8 unpickled every one
of them. Every file carries a size and CRC32 record that matches it; copies with one byte flipped in a tensor, or a
file cut short, are named by load_checkpoint and the command-line tools; 0.19.8 loaded the flipped byte.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from toolkit.launch import launch_cases
from helpers.universal import to_universal_command

WORKER = Path(__file__).parent / "workers" / "checkpoint_swap.py"
TAG = "swap"
# CI's configurations: ZeRO-2 (universal and resharded loads too), ZeRO-3 with fp16's dynamic loss scaler (the
# scaler's class is in the files), the pipeline (layer files). --run-slow adds the rest of the resume matrix.
CI_CONFIGS = ["zero2_fp32_clip", "zero3_fp16_dynamic_scale", "pipe2_zero1_fp32_clip"]
SLOW_CONFIGS = [
    "zero1_fp32_clip", "zero1_bf16_clip", "zero2_fp16_dynamic_scale_clip", "zero2_offload_fp32_clip",
    "zero3_offload_fp32_clip", "zero1_muon_clip", "zero3_muon_clip", "moe2_zero2_fp32_clip"
]
PAYLOAD_CONFIGS = CI_CONFIGS  # the loaders' cases, at every stage and the pipeline
RESHARDED = "zero2_fp32_clip"  # saved on 2 ranks, loaded on 1: reshard_on_load, and its universal form
TIMEOUT = 300  # seconds, a command-line tool


class Payload:
    """Unpickled, it creates the directory ``marker``: proof that loading the file ran code from it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        # makedirs(exist_ok): every rank that unpickles it succeeds, so an unchecked load goes on as if nothing happened
        return (os.makedirs, (self.marker, 0o777, True))


def selected_configs(request):
    return CI_CONFIGS + (SLOW_CONFIGS if request.config.getoption("--run-slow") else [])


@pytest.fixture(scope="module")
def clean(tmp_path_factory, extensions_dir, request):
    """{config: checkpoint directory} of clean checkpoints written by 2 ranks."""
    root = tmp_path_factory.mktemp("safe-checkpoints") / "clean"
    configs = selected_configs(request)
    launched = launch_cases(WORKER,
                            2,
                            extensions_dir=extensions_dir,
                            extra_args=["--save", str(root), "--configs", ",".join(configs)],
                            timeout=900)
    for config in configs:
        launched.case(f"save/{config}")
    return {config: root / config for config in configs}


def tag_files(checkpoint):
    return sorted((checkpoint / TAG).rglob("*.pt"))


def add_payload(path, marker):
    state = torch.load(path, weights_only=False)
    state["payload"] = Payload(marker)
    torch.save(state, path)


def payload_copy(clean_dir, root, label, pick):
    """A copy of the checkpoint ``clean_dir`` under ``root/label`` with a payload in the file ``pick(files)``; returns
    (the copy, the poisoned file, the payload's marker)."""
    copy = root / label / clean_dir.name
    shutil.copytree(clean_dir, copy)
    target = pick(tag_files(copy))
    marker = root / f"ran-{label}-{clean_dir.name}"
    add_payload(target, marker)
    return copy, target, marker


def named(suffix):

    def pick(files):
        matches = [path for path in files if path.name.endswith(suffix)]
        assert matches, f"no file ending in {suffix} among {[path.name for path in files]}"
        return matches[0]

    return pick


def model_file(files):
    """The file the engine reads the model from: the pipeline's last layer file, else the model states."""
    layers = [path for path in files if path.name.startswith("layer_")]
    return layers[-1] if layers else named("model_states.pt")(files)


def rank1_optim_file(files):
    """Rank 1's optimizer states: read by rank 1, and by every rank of a resharded load."""
    matches = [path for path in files if "optim_states" in path.name and "zero_pp_rank_1_" in path.name]
    return matches[0] if matches else named("optim_states.pt")(files)


def deep_equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(deep_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(deep_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and not isinstance(a, type):
        return type(a) is type(b) and deep_equal(vars(a), vars(b))
    return type(a) is type(b) and a == b


@pytest.mark.fork_only
@pytest.mark.parametrize("config", CI_CONFIGS + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CONFIGS])
def test_every_file_loads_safely_as_it_was_written(clean, config):
    from deepspeed.checkpoint.safe_load import load_file
    files = tag_files(clean[config])
    assert files, f"{config}: no checkpoint files"
    for path in files:
        safe = load_file(path, map_location="cpu")
        assert deep_equal(safe, torch.load(path, map_location="cpu", weights_only=False)), path


@pytest.mark.fork_only
def test_client_state_values_round_trip(tmp_path):
    """What a training script keeps in client_state: Python, torch and numpy values (a numpy RNG state, metrics)."""
    import argparse
    import numpy as np
    from deepspeed.checkpoint.safe_load import load_file
    state = {
        "epoch": 3,
        "seen": {"a", "b"},
        "shape": torch.Size([2, 3]),
        "dtype": torch.bfloat16,
        "torch_rng": torch.get_rng_state(),
        "numpy_rng": np.random.get_state(),
        "loss": np.float32(0.25),
        "counts": np.arange(4, dtype=np.int64),
        "args": argparse.Namespace(lr=0.1, name="run"),
    }
    path = tmp_path / "client_state.pt"
    torch.save(state, path)
    loaded = load_file(path)
    assert loaded.keys() == state.keys()
    for key, value in state.items():
        if key == "numpy_rng":
            assert all(np.array_equal(a, b) for a, b in zip(loaded[key], value)), key
        elif isinstance(value, (torch.Tensor, np.ndarray)):
            assert np.array_equal(np.asarray(loaded[key]), np.asarray(value)), key
        else:
            assert loaded[key] == value and type(loaded[key]) is type(value), key


TOOLS = ["zero_to_fp32 module", "zero_to_fp32.py in the checkpoint", "ds_to_universal"]


def tool_command(tool, checkpoint, out):
    """The command line of one of TOOLS that converts the checkpoint directory ``checkpoint`` into ``out``."""
    return {
        "zero_to_fp32 module": [sys.executable, "-m", "deepspeed.utils.zero_to_fp32", checkpoint, out, "--tag", TAG],
        "zero_to_fp32.py in the checkpoint":
        [sys.executable, checkpoint / "zero_to_fp32.py", checkpoint, out, "--tag", TAG],
        "ds_to_universal":
        to_universal_command(checkpoint / TAG, out),
    }[tool]


def run_tool(command, cwd):
    return subprocess.run([str(part) for part in command],
                          cwd=cwd,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE,
                          text=True,
                          timeout=TIMEOUT)


@pytest.fixture(scope="module")
def refused(clean, tmp_path_factory, extensions_dir):
    """{(label, config): (the rank reports of loading the poisoned copy, poisoned file, marker)}."""
    root = tmp_path_factory.mktemp("payloads")
    copies = {}
    for config in PAYLOAD_CONFIGS:
        copies[("model", config)] = payload_copy(clean[config], root, "model", model_file)
        copies[("optim", config)] = payload_copy(clean[config], root, "optim", rank1_optim_file)
    # A universal checkpoint (the tag "universal" the worker's universal case loads) with a payload in one fragment.
    universal = root / "universal" / RESHARDED
    shutil.copytree(clean[RESHARDED], universal)
    convert = run_tool(to_universal_command(universal / TAG, universal / "universal"), cwd=root)
    assert convert.returncode == 0, convert.stderr[-3000:]
    fragment = sorted((universal / "universal" / "zero").rglob("fp32.pt"))[0]
    copies[("universal", RESHARDED)] = (universal, fragment, root / "ran-universal")
    add_payload(fragment, root / "ran-universal")

    def load_on(nprocs, *args):
        return launch_cases(WORKER, nprocs, extensions_dir=extensions_dir, extra_args=list(args), timeout=300)

    on_two = load_on(2, "--resume", f"model={root / 'model'}", "--resume", f"optim={root / 'optim'}", "--configs",
                     ",".join(PAYLOAD_CONFIGS))
    on_one = load_on(1, "--reshard", f"optim={root / 'optim'}", "--universal", f"u={root / 'universal'}", "--configs",
                     RESHARDED)
    results = {
        (f"resume-{label}", config): (on_two, target, marker)
        for (label, config), (_, target, marker) in copies.items() if label != "universal"
    }
    results[("reshard-optim", RESHARDED)] = (on_one, *copies[("optim", RESHARDED)][1:])
    results[("universal-u", RESHARDED)] = (on_one, *copies[("universal", RESHARDED)][1:])
    return results


def assert_refused(launched, case, target, marker):
    for rank, cases in enumerate(launched.ranks):
        outcome = cases[case]
        assert not marker.exists(), f"{case}: loading the checkpoint ran the payload in {target.name}"
        assert not outcome["ok"], f"{case}, rank {rank}: the checkpoint with a payload in {target.name} loaded"
        assert "UnsafeCheckpointError" in outcome["error"] and str(
            target) in outcome["error"], outcome["error"][-2000:]


@pytest.mark.parametrize("label", ["model", "optim"])
@pytest.mark.parametrize("config", PAYLOAD_CONFIGS)
def test_load_checkpoint_refuses_a_payload(refused, label, config):
    launched, target, marker = refused[(f"resume-{label}", config)]
    assert_refused(launched, f"resume-{label}/{config}", target, marker)


def test_resharded_load_refuses_a_payload_and_converts_nothing(refused):
    launched, target, marker = refused[("reshard-optim", RESHARDED)]
    assert_refused(launched, f"reshard-optim/{RESHARDED}", target, marker)
    made = sorted(path.name for path in target.parents[1].iterdir() if "universal" in path.name)
    assert not made, f"a refused reshard wrote {made} beside the checkpoint"


def test_universal_load_refuses_a_payload_in_a_fragment(refused):
    launched, target, marker = refused[("universal-u", RESHARDED)]
    assert_refused(launched, f"universal-u/{RESHARDED}", target, marker)


@pytest.fixture
def poisoned(clean, tmp_path):
    """A copy of the ZeRO-2 checkpoint with a payload in rank 1's optimizer states: (directory, file, marker)."""
    return payload_copy(clean[RESHARDED], tmp_path, "optim", rank1_optim_file)


@pytest.mark.parametrize("tool", TOOLS)
def test_command_line_tools_refuse_a_payload(poisoned, tmp_path, tool):
    checkpoint, target, marker = poisoned
    proc = run_tool(tool_command(tool, checkpoint, tmp_path / "out"), cwd=tmp_path)
    assert not marker.exists(), f"{tool} ran the payload in {target.name}"
    assert proc.returncode != 0, f"{tool} converted a checkpoint with a payload in {target.name}"
    assert f"Refused to load checkpoint file {target}" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.fork_only
def test_command_line_opt_in_trusts_the_files(poisoned, tmp_path):
    checkpoint, target, marker = poisoned
    proc = run_tool([
        sys.executable, "-m", "deepspeed.utils.zero_to_fp32", checkpoint, tmp_path / "out", "--tag", TAG,
        "--no_weights_only"
    ],
                    cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert marker.is_dir(), "--no_weights_only did not unpickle the file as it is"


def test_fast_checkpoint_engine_loads_a_clean_checkpoint(clean):
    """upstream #8500: FastCheckpointEngine loaded with torch's default, weights_only=True without DeepSpeed's
    classes, and refused every clean ZeRO-2 optimizer file."""
    from deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine import FastCheckpointEngine
    path = named("optim_states.pt")(tag_files(clean[RESHARDED]))
    state = FastCheckpointEngine.load(FastCheckpointEngine.__new__(FastCheckpointEngine), str(path))
    assert deep_equal(state, torch.load(path, weights_only=False))


def test_inference_v2_model_config_refuses_a_payload(tmp_path):
    """An inference v2 checkpoint's ds_model_config.pkl: 0.19.8 unpickled it with plain pickle.load."""
    import json
    import pickle
    from deepspeed.inference.v2.config_v2 import RaggedInferenceEngineConfig
    from deepspeed.inference.v2.engine_factory import build_engine_from_ds_checkpoint
    from deepspeed.inference.v2.model_implementations.flat_model_helpers import ModelMetadata, make_metadata_filename
    marker = tmp_path / "ran"
    with open(make_metadata_filename(str(tmp_path), 0, 1), "w") as f:
        json.dump(ModelMetadata(policy="Llama2Policy").json(), f)
    with open(tmp_path / "ds_model_config.pkl", "wb") as f:
        pickle.dump({"config": Payload(marker)}, f)
    with pytest.raises(pickle.UnpicklingError, match="Refused to load"):
        build_engine_from_ds_checkpoint(str(tmp_path), RaggedInferenceEngineConfig())
    assert not marker.exists(), "reading the model config ran code from it"


def flip_tensor_byte(path):
    """Flip one byte in the middle of the file's largest tensor: the file still loads, with one element changed."""
    reader = torch._C.PyTorchFileReader(str(path))
    storages = [name for name in reader.get_all_records() if "/data/" in f"/{name}" and not name.endswith(".pkl")]
    largest = max(storages, key=reader.get_record_size)
    offset = reader.get_record_offset(largest) + reader.get_record_size(largest) // 2
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x10]))


def truncate(path):
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def damaged_copy(clean_dir, root, label, pick, damage):
    """A copy of the checkpoint ``clean_dir`` under ``root/label`` with ``damage`` done to the file ``pick(files)``;
    returns (the copy, the damaged file)."""
    copy = root / label / clean_dir.name
    shutil.copytree(clean_dir, copy)
    target = pick(tag_files(copy))
    damage(target)
    return copy, target


@pytest.mark.fork_only
@pytest.mark.parametrize("config", CI_CONFIGS + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW_CONFIGS])
def test_every_file_carries_a_record_that_matches_it(clean, config):
    from deepspeed.checkpoint import integrity
    for path in tag_files(clean[config]):
        record = integrity.record_path(path)
        assert os.path.isfile(record), f"{config}: {path.name} has no checksum record"
        with open(record) as f:
            assert json.load(f) == integrity.file_record(path), path


DAMAGES = {"flipped": (rank1_optim_file, flip_tensor_byte), "truncated": (model_file, truncate)}


@pytest.fixture(scope="module")
def damaged(clean, tmp_path_factory, extensions_dir):
    """{(label, config): (the rank reports of loading the damaged copy, damaged file)}."""
    root = tmp_path_factory.mktemp("damaged")
    copies = {
        (label, config): damaged_copy(clean[config], root, label, pick, damage)
        for label, (pick, damage) in DAMAGES.items()
        for config in PAYLOAD_CONFIGS
    }
    launched = launch_cases(WORKER,
                            2,
                            extensions_dir=extensions_dir,
                            extra_args=[f"--resume={label}={root / label}"
                                        for label in DAMAGES] + ["--configs", ",".join(PAYLOAD_CONFIGS)],
                            timeout=300)
    return {key: (launched, target) for key, (_, target) in copies.items()}


@pytest.mark.parametrize("label", list(DAMAGES))
@pytest.mark.parametrize("config", PAYLOAD_CONFIGS)
def test_load_checkpoint_names_a_damaged_file(damaged, label, config):
    launched, target = damaged[(label, config)]
    case = f"resume-{label}/{config}"
    for rank, cases in enumerate(launched.ranks):
        outcome = cases[case]
        assert not outcome["ok"], f"{case}, rank {rank}: the checkpoint with {target.name} {label} loaded"
        # Every rank names it, the ranks that did not read it too: none is left waiting in a collective.
        assert "CheckpointIntegrityError" in outcome["error"] and str(
            target) in outcome["error"], outcome["error"][-2000:]


@pytest.mark.parametrize("tool", TOOLS)
def test_command_line_tools_name_a_damaged_file(clean, tmp_path, tool):
    checkpoint, target = damaged_copy(clean[RESHARDED], tmp_path, "flipped", rank1_optim_file, flip_tensor_byte)
    proc = run_tool(tool_command(tool, checkpoint, tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode != 0, f"{tool} converted a checkpoint with a byte flipped in {target.name}"
    assert f"Checkpoint file {target} is not the file that was saved" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
