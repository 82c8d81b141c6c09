# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Resuming on another number of ranks: a checkpoint written on W data-parallel ranks, loaded on R with ``"checkpoint":
{"reshard_on_load": true}`` (patch Reshard-a-ZeRO-checkpoint-on-load-for-another-data-p), continues the writer's own
run.

Every step trains the same global batch of 8 samples, split as GAS 4 on 1 rank, 2 on 2 and 1 on 4
(tests/workers/checkpoint_swap.py). The writer trains 3 steps, saves, and goes on 3 more; the reader builds its engine
from other initial weights, loads, and trains the same 3. The reader's restored state (step and sample counters,
learning rate and schedule, skipped steps, fp16's loss scaler) must equal the writer's at the save, and its weights
after the 3 steps the writer's within fp32's rounding of another summation order (1e-6), or the dtype's tolerance.
0.19.8 refuses every such load with a ZeRORuntimeException (ZeRO-3 from 1 rank to 2: an AssertionError), so every case
here fails there. Muon's momentum, and a ZeRO-3 checkpoint saved before the optimizer's first step
(``zero3_fp16_dynamic_scale``: every step so far skipped for overflow), convert since patch
Convert-and-load-the-optimizer-s-own-states-in-unive, and DeepSpeed MoE's expert-parallel experts (each rank numbers
its own from 0) since patch Name-DeepSpeed-MoE-s-experts-by-their-global-id-in-u.
"""

from pathlib import Path

import pytest
import torch

from helpers.continuation import TOLERANCE, dtype_of, relative_error
from toolkit.launch import launch_cases
from helpers.selection import selected_callspecs

WORKER = Path(__file__).parent / "workers" / "checkpoint_swap.py"
CONFIGS = [
    "zero1_fp32_clip", "zero2_fp32_clip", "zero3_fp32_clip", "zero1_bf16_clip", "zero1_bf16_fp32_accum_clip",
    "zero2_round_robin_fp32_clip", "zero2_fp16_dynamic_scale_clip", "zero3_fp16_dynamic_scale",
    "zero1_fp16_stepping_clip", "zero2_fp16_stepping_clip", "zero3_fp16_stepping", "zero2_offload_fp32_clip",
    "zero3_offload_fp32_clip", "zero1_muon_clip", "zero2_muon_clip", "zero2_offload_muon_clip", "zero3_muon_clip"
]
MOVES = [(2, 1), (1, 2), (2, 4), (4, 2)]
# The 2-stage pipeline keeps its 2 stages (1 data-parallel replica on 2 ranks, 2 on 4), and the MoE layer its expert
# parallel degree 2 (1 replica of each expert on 2 ranks, 2 on 4).
PIPELINE, MOE = "pipe2_zero1_fp32_clip", "moe2_zero2_fp32_clip"
KEPT_DEGREE_MOVES = [(2, 4), (4, 2)]
# CI's cases (its 30 minutes: two launches): ZeRO-3 from 2 ranks to 1, and ZeRO-1 Muon (its momentum kept whole per
# matrix, one matrix split between the ranks); --run-slow adds the other moves, ZeRO-1/2, bf16, fp16's loss scaler,
# offload and Muon on ZeRO-2/3.
CI_CASES = {("zero3_fp32_clip", 2, 1), ("zero1_muon_clip", 2, 1)}
# The layouts that a reshard still converts through the universal format (a copy beside the checkpoint): none of
# these since MoE's expert groups and Muon's momentum reshard as they load too (an expert-parallel degree that
# changes still converts: unit/checkpoint/test_universal_moe_checkpoint.py). Every configuration here writes nothing
# on load.
UNIVERSAL_ROUTE = set()
# Another split of the global batch sums the gradients in another order: fp32 rounding, not 0.
FP32_REORDERED = 1e-6
# Muon's Newton-Schulz runs in fp16 (its default "gram" method; the workers declare fp16 supported), which turns that
# fp32 rounding into fp16's: the uninterrupted runs on 1 and 2 ranks end 5.5e-5 apart (norm), a resume 2 -> 1 ranks
# 2.3e-4 (ZeRO-1) from the writer. A momentum lost on load is 1.6e-2 away (norm, 2 -> 2 ranks, 2 steps).
MUON_NEWTON_SCHULZ = TOLERANCE["fp16"]


def case_params():
    for config, moves in [(config, MOVES) for config in CONFIGS] + [(MOE, KEPT_DEGREE_MOVES),
                                                                    (PIPELINE, KEPT_DEGREE_MOVES)]:
        for writer, reader in moves:
            marks = [] if (config, writer, reader) in CI_CASES else [pytest.mark.slow]
            yield pytest.param(config, writer, reader, marks=marks, id=f"{config}-{writer}to{reader}")


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, extensions_dir, request):
    """(config, writer, reader) -> (the writer's reports, the reader's), for the cases this run selected: one launch
    per world size that writes, then one per world size that reads what it has not read yet."""
    root = tmp_path_factory.mktemp("resume-world-size")
    cases = [(spec["config"], spec["writer"], spec["reader"]) for spec in selected_callspecs(request, "resumed")]
    configs = sorted({config for config, _, _ in cases}, key=(CONFIGS + [MOE, PIPELINE]).index)
    writers = sorted({writer for _, writer, _ in cases})
    readers = {reader: sorted({writer for _, writer, r in cases if r == reader}) for _, _, reader in cases}
    saved, read, launches = set(), {}, {}

    def launch(world, save):
        """One launch on ``world`` ranks: it saves if asked, and reads every checkpoint saved by now that it needs."""
        reads = [writer for writer in readers.get(world, []) if writer in saved and writer not in read.get(world, [])]
        if not save and not reads:
            return
        args = ["--configs", ",".join(configs)] + (["--save", str(root / f"ws{world}")] if save else [])
        for writer in reads:
            args += ["--reshard", f"w{writer}={root / f'ws{writer}'}"]
        launched = launch_cases(WORKER, world, extensions_dir=extensions_dir, extra_args=args, timeout=900)
        launches.setdefault(world, []).append(launched)
        read.setdefault(world, []).extend(reads)
        if save:
            saved.add(world)

    # Every writer saves (those that read nothing first), then each reader reads what it has not read yet.
    for world in sorted(writers, key=lambda world: world in readers):
        launch(world, save=True)
    for world in readers:
        launch(world, save=False)

    def reports(world, name):
        for launched in launches[world]:
            if name in launched.ranks[0]:
                return launched.case(name)
        raise LookupError(f"no launch on {world} rank(s) ran {name}")

    # Read by each test: a case that raised fails its own test only.
    return lambda config, writer, reader: (reports(writer, f"save/{config}"),
                                           reports(reader, f"reshard-w{writer}/{config}"))


def one_model(ranks, config):
    """The weights every data-parallel rank reports (they must agree). A pipeline's stages each report their own
    layers (stage s on ranks s x replicas .. (s + 1) x replicas - 1); with MoE, rank r reports expert r % 2 beside
    the dense layers."""
    if config == PIPELINE:
        holders = [ranks[:len(ranks) // 2], ranks[len(ranks) // 2:]]
    elif config == MOE:
        holders = [ranks[0::2], ranks[1::2]]
    else:
        holders = [ranks]
    weights = []
    for replicas in holders:
        assert all(rank["weights"] == replicas[0]["weights"] for rank in replicas), f"{config}: the replicas disagree"
        weights += replicas[0]["weights"]
    return torch.tensor(weights, dtype=torch.float64)


@pytest.mark.parametrize("config, writer, reader", case_params())
def test_resumes_on_another_world_size(resumed, config, writer, reader):
    saved, loaded = resumed(config, writer, reader)
    for rank, restored in enumerate(loaded):
        assert restored["state"] == saved[0]["state"], f"{config}, {writer} -> {reader} ranks, rank {rank}"
    route = "through the universal format" if config in UNIVERSAL_ROUTE else "as it loads"
    assert loaded[0]["universal_copy"] == (config in UNIVERSAL_ROUTE), f"{config}: expected a reshard {route}"
    if "stepping" in config:  # the optimizer stepped before the save and the scale grew: Adam's states crossed
        assert saved[0]["state"]["skipped_steps"] == 0 and saved[0]["state"]["loss_scale"] > 2**8, saved[0]["state"]
    error = relative_error(one_model(saved, config), one_model(loaded, config))
    tolerance = MUON_NEWTON_SCHULZ if "muon" in config else TOLERANCE[dtype_of(config)] or FP32_REORDERED
    print(f"{config}: {writer} -> {reader} ranks: weights {error:.3g} from the writer's own continuation")
    assert error <= tolerance, (
        f"{config}: written on {writer} rank(s), resumed on {reader}: the weights after the "
        f"further steps are {error:.3g} (relative) from the writer's own (tolerance {tolerance})")
