# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The Hugging Face Trainer (+ accelerate) applies the same gradients with and without DeepSpeed.

Tiny Llama and Qwen3 models built from config train 2 steps of plain SGD (fp32, CPU, clipping off)
on padded and unpadded rows, with ``model_accepts_loss_kwargs`` as the model says (True) and forced
False, without DeepSpeed and at ZeRO 0/1/2/3 and ZeRO-2/3 with CPU offload, split micro-batch x GAS
as 1x8 and 8x1 on one rank and 1x4 on two. Every case must apply, at every step, the gradient of a
plain fp64 PyTorch reference: the global token mean when the model takes ``num_items_in_batch``, the
mean of the micro-batches' own means when it does not. One launch per world size runs the grid
(tests/workers/hf_trainer.py); docs/guides/hf_trainer.md has the versions and what older ones get wrong.

Needs transformers and accelerate (tests/requirements.txt pins the tested versions); without them
the module is skipped, or fails where DS_GAFIX_REQUIRE_HF=1 (CI) says they must be there.
"""

import pytest

from helpers.hf_required import require_transformers_and_accelerate
from toolkit.launch import launch_cases
from helpers.repo import REPO
from helpers.selection import selected_callspecs

require_transformers_and_accelerate()

from hf_training import cases  # noqa: E402
from hf_training.verdict import TOLERANCE, problems  # noqa: E402

WORKER = REPO / "tests" / "workers" / "hf_trainer.py"
# CI trains the Llama grid (CI's 30 minutes); --run-slow adds these models' grids.
SLOW_MODELS = ("qwen3", )


def slow(case):
    """--run-slow only: the other models' grids, and the one-rank split without accumulation (8x1): CI
    keeps 1x8 on one rank (GAS 8, where num_items_in_batch spans micro-batches) and 1x4 on two."""
    return case.model in SLOW_MODELS or case.gas == 1


def cases_read(request, world_size):
    """The cases the selected tests read on ``world_size`` ranks, in the worker's order: -k narrows a launch,
    and the slow ones run with --run-slow only. A test without ``name`` reads objectives_differ."""
    read = {
        params.get("name", "objectives_differ")
        for params in selected_callspecs(request, "launched") if params["launched"] == world_size
    }
    return [name for name in ["objectives_differ"] + [case.name for case in cases.grid(world_size)] if name in read]


def launch(world_size, extensions_dir, request):
    return launch_cases(WORKER,
                        nprocs=world_size,
                        cases=cases_read(request, world_size),
                        extensions_dir=extensions_dir,
                        timeout=1200,
                        extra_args=["--world-size", str(world_size)])


@pytest.fixture(scope="module")
def launches(extensions_dir):
    return {}


@pytest.fixture
def launched(launches, extensions_dir, request):
    """The launch of ``request.param`` ranks, started by the first test that needs it."""
    world_size = request.param
    if world_size not in launches:
        launches[world_size] = launch(world_size, extensions_dir, request)
    return launches[world_size]


def params(world_size):
    return [
        pytest.param(world_size,
                     case.name,
                     id=f"{world_size}rank-{case.name}",
                     marks=[pytest.mark.slow] if slow(case) else []) for case in cases.grid(world_size)
    ]


@pytest.mark.parametrize("launched", [1, 2], indirect=True)
def test_objectives_are_told_apart(launched):
    """The padded rows make the two objectives' gradients differ far beyond the tolerance (else the
    forced-False cases could not fail), and the unpadded rows make them equal."""
    for differ in launched.case("objectives_differ"):
        for rows, distance in differ.items():
            if rows.endswith("-padded"):
                assert distance > 1000 * TOLERANCE, f"{rows}: objectives only {distance:.2e} apart"
            else:
                assert distance < TOLERANCE, f"{rows}: equal-length rows, yet objectives {distance:.2e} apart"


@pytest.mark.parametrize("launched,name", params(1) + params(2), indirect=["launched"])
def test_trainer_applies_reference_gradient(launched, name):
    case = cases.find(len(launched.ranks), name)
    for rank, outcome in enumerate(launched.case(name)):
        found = problems(case, outcome)
        assert not found, f"rank {rank}, {name}:\n  " + "\n  ".join(found)
