# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Checkpoints across the swap: a user moves between pristine 0.19.8 and the fork mid-training.

2 CPU ranks. Each install trains every configuration (ZeRO 1/2/3, bf16, fp16 with its dynamic loss
scaler, optimizer offload, a 2-stage pipeline; Adam, WarmupLR, gradient clipping), saves a checkpoint
and continues in the same process. Then each install loads the other's checkpoints (and its own: the
control that shows the method is exact) and continues the same steps. A checkpoint crosses intact when
the loader restores what the writer had (step counters, learning rate, loss scaler) and its weights
after the further steps equal the writer's own continuation: bit for bit in fp32, within the dtype's
tolerance otherwise. A fork-written ZeRO checkpoint converted by the fork's ds_to_universal loads into
pristine 0.19.8 the same way.
"""

import subprocess
from pathlib import Path

import pytest
import torch

from helpers.continuation import TOLERANCE, dtype_of, relative_error
from toolkit.launch import launch_cases, local_ranks_command
from helpers.pristine import pristine_python
from helpers.selection import selected_params
from helpers.universal import to_universal_command

pytestmark = pytest.mark.fork_only

WORKER = Path(__file__).parent / "workers" / "checkpoint_swap.py"
CONFIGS = [
    "zero1_fp32", "zero3_fp32", "zero1_fp32_clip", "zero2_fp32_clip", "zero3_fp32_clip", "zero1_bf16_clip",
    "zero2_fp16_dynamic_scale_clip", "zero3_fp16_dynamic_scale", "zero2_offload_fp32_clip", "zero3_offload_fp32_clip",
    "pipe2_zero1_fp32_clip"
]
UNIVERSAL = ["zero1_fp32_clip", "zero2_fp32_clip"]
# CI's configurations (CI's 30 minutes; each costs about 40 s there): ZeRO-1 with the universal
# checkpoint, ZeRO-3 with fp16's dynamic loss scaler, and the pipeline; --run-slow adds the rest (ZeRO-2,
# bf16, offload).
CI_CONFIGS = ["zero1_fp32_clip", "zero3_fp16_dynamic_scale", "pipe2_zero1_fp32_clip"]


def config_param(config):
    return pytest.param(config, marks=[] if config in CI_CONFIGS else [pytest.mark.slow])


TAG = "swap"
# With clipping, a run continued by the other install clips by that install's grad norm: the fork sums
# squares in one fused pass (fp32 lanes, fp64 combine), 0.19.8 per tensor in fp64, so the two norms can
# differ in the last bits of fp32 (seen: 2e-8 and 8e-8 relative on the weights after 3 steps). Continued
# by the writer itself, every configuration must be exact.
CROSS_INSTALL_CLIP_FP32 = 1e-6


def tolerance_of(config, writer, loader):
    if writer == loader:
        return 0.0
    if dtype_of(config) == "fp32" and "clip" in config:
        return CROSS_INSTALL_CLIP_FP32
    return TOLERANCE[dtype_of(config)]


def weights_of(ranks, config):
    """The model's weights from the ranks' reports: every rank holds all of them, but a pipeline
    stage holds only its own layers."""
    if config.startswith("pipe"):
        return torch.tensor(ranks[0]["weights"] + ranks[1]["weights"], dtype=torch.float64)
    assert ranks[0]["weights"] == ranks[1]["weights"], f"{config}: the data-parallel ranks disagree"
    return torch.tensor(ranks[0]["weights"], dtype=torch.float64)


@pytest.fixture(scope="module")
def swapped(tmp_path_factory, extensions_dir, request):
    """Every install's own run and every load, as {(writer, loader): {config: ranks' reports}}."""
    root = tmp_path_factory.mktemp("checkpoint-swap")
    # The configurations of the tests this run selected (-k narrows the launches; the slow ones need --run-slow).
    selected = set(selected_params(request, "config", "swapped"))
    configs = [config for config in CONFIGS if config in selected]
    fork_launcher = None
    pristine_launcher = local_ranks_command(pristine_python())
    written = {"pristine": root / "pristine", "fork": root / "fork"}

    def launch(launcher, *args):
        return launch_cases(WORKER,
                            2,
                            extensions_dir=extensions_dir,
                            extra_args=[*args, "--configs", ",".join(configs)],
                            launcher=launcher,
                            timeout=900)

    def by_prefix(launched, prefix):
        ran = set(launched.ranks[0])
        return {config: launched.case(f"{prefix}/{config}") for config in CONFIGS if f"{prefix}/{config}" in ran}

    # Pristine writes. The fork writes, then loads pristine's and its own.
    first = launch(pristine_launcher, "--save", str(written["pristine"]))
    runs = {("pristine", "pristine-own"): by_prefix(first, "save")}
    second = launch(fork_launcher, "--save", str(written["fork"]), "--resume", f"p={written['pristine']}", "--resume",
                    f"f={written['fork']}")
    runs[("fork", "fork-own")] = by_prefix(second, "save")
    runs[("pristine", "fork")] = by_prefix(second, "resume-p")
    runs[("fork", "fork")] = by_prefix(second, "resume-f")

    # The fork converts its ZeRO checkpoints to the universal format; pristine loads them, and its own.
    for config in (config for config in UNIVERSAL if config in configs):
        convert = subprocess.run(to_universal_command(written["fork"] / config / TAG,
                                                      written["fork"] / config / "universal"),
                                 stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT,
                                 text=True)
        assert convert.returncode == 0, f"ds_to_universal failed on the fork's {config}:\n{convert.stdout[-3000:]}"
    third = launch(pristine_launcher, "--resume", f"f={written['fork']}", "--resume", f"p={written['pristine']}",
                   "--universal", f"f={written['fork']}")
    runs[("fork", "pristine")] = by_prefix(third, "resume-f")
    runs[("pristine", "pristine")] = by_prefix(third, "resume-p")
    runs[("fork-universal", "pristine")] = by_prefix(third, "universal-f")
    return runs


def check_continuation(runs, writer, loader, config):
    own = runs[(writer, f"{writer}-own")][config]
    loaded = runs[(writer, loader)][config]
    for rank, (saved, restored) in enumerate(zip(own, loaded)):
        assert restored["state"] == saved["state"], f"{config}, rank {rank}: the restored state differs"
    expected, got = weights_of(own, config), weights_of(loaded, config)
    error = relative_error(expected, got)
    tolerance = tolerance_of(config, writer, loader)
    print(f"{config}: {writer} -> {loader}: weights {error:.3g} from the {writer}'s own continuation")
    assert error <= tolerance, (f"{config}: {writer}-written, {loader}-loaded weights after the further steps are "
                                f"{error:.3g} (relative) from the {writer}'s own continuation (tolerance {tolerance})")


@pytest.mark.parametrize("config", [config_param(config) for config in CONFIGS])
@pytest.mark.parametrize("writer, loader", [("pristine", "fork"), ("fork", "pristine"), ("pristine", "pristine"),
                                            ("fork", "fork")])
def test_checkpoint_crosses_the_swap(swapped, writer, loader, config):
    check_continuation(swapped, writer, loader, config)


@pytest.mark.parametrize("config", [config_param(config) for config in UNIVERSAL])
def test_fork_universal_checkpoint_loads_into_pristine(swapped, config):
    own = swapped[("fork", "fork-own")][config]
    loaded = swapped[("fork-universal", "pristine")][config]
    for rank, (saved, restored) in enumerate(zip(own, loaded)):
        assert restored["state"]["global_steps"] == saved["state"]["global_steps"], f"{config}, rank {rank}"
        assert restored["state"]["lr"] == saved["state"]["lr"], f"{config}, rank {rank}"
    expected, got = weights_of(own, config), weights_of(loaded, config)
    error = relative_error(expected, got)
    assert error <= 1e-6, f"{config}: universal checkpoint continued {error:.3g} (relative) from the fork's own run"
