# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Each optimizer DeepSpeed's config names, on each ZeRO stage (CPU offload where it has a CPU op), steps as
torch's optimizer (or the published rule) after clip_grad_norm_: three clipped steps at two micro-batch x GAS
splits against fp64 PyTorch, and one collective per step (tests/workers/optimizer_updates.py). The table of
both installs is tools/optimizer-table's (docs/evidence/optimizers/report.md).

Regression test for Muon under ZeRO-1/2/3 (patch Clip-Muon-s-gradient-not-its-orthogonalized-update-u): 0.19.8 clips
the orthogonalized update instead of the gradient (update 58% off, reported norm the update's, 4.6x the gradient's),
and takes 2-3 collectives.
"""

import pytest
import torch

from toolkit.launch import LaunchesByRanks
from optimizer_criteria import collectives, problems
from helpers.repo import REPO
from helpers.selection import params_of, selected_items

WORKER = REPO / "tests" / "workers" / "optimizer_updates.py"
# CI's share: Muon on every ZeRO stage and path patch Clip-Muon-s-gradient-not-its-orthogonalized-update-u changed, in
# each dtype. The rest of the table needs DeepSpeed's CPU Adam, Adagrad and Lion ops (a JIT build each) and about 12
# minutes: --run-slow.
FAST = ["Muon_zero1_fp32", "Muon_zero2_offload_fp32", "Muon_zero3_fp32", "Muon_zero2_bf16", "Muon_zero1_fp16"]
# What a CPU cannot run: FusedLion and FusedLamb have no CPU op (tools/optimizer-table runs these on 2 GPUs).
NEEDS_GPU = {f"{kind}_zero{stage}_fp32" for kind in ("Lion", "Lamb") for stage in range(4)}
# Muon's reference is torch.optim.Muon, which torch ships from 2.9 on; on older torch tests/test_gas_check.py's Muon
# cases check the engine against the rule written out.
NO_REFERENCE = pytest.mark.skipif(not hasattr(torch.optim, "Muon"),
                                  reason=f"torch.optim.Muon, the reference, is not in torch {torch.__version__}")


def marks(case):
    return ([] if case in FAST else [pytest.mark.slow]) + ([NO_REFERENCE] if case.startswith("Muon") else [])


def all_cases():
    import importlib.util
    spec = importlib.util.spec_from_file_location("optimizer_updates_cases", WORKER)
    # The case names only: the worker's module imports deepspeed and torch, both installed here.
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CASES)


CASES = all_cases()


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    selected = list(dict.fromkeys(params_of(item)["case"] for item in selected_items(request, "launched")))
    return LaunchesByRanks(WORKER, lambda ranks: selected, extensions_dir=extensions_dir, timeout=2400)[2]


@pytest.mark.parametrize("case", [pytest.param(case, marks=marks(case)) for case in CASES if case not in NEEDS_GPU])
def test_steps_like_torch(launched, case):
    ranks = launched.case(case)
    for rank, splits in enumerate(ranks):
        assert not problems(case, splits), f"rank {rank}: {problems(case, splits)}"


@pytest.mark.fork_only
@pytest.mark.parametrize(
    "case", [pytest.param(case, marks=marks(case)) for case in CASES if case not in NEEDS_GPU and "zero0" not in case])
def test_one_collective_per_step(launched, case):
    """ZeRO's step() reduces once: the norm, the overflow flag (fp16) and nothing else. (ZeRO-0's gradients
    are all-reduced in backward and its norm needs no collective.)"""
    for rank, splits in enumerate(launched.case(case)):
        assert collectives(splits) == 1, f"rank {rank}: {splits}"


def muon_result(norms, newton_schulz_dtype):
    return {
        "2x4": {
            "max_rel_error": 0.0,
            "norms": norms,
            "reference_norms": [1.0] * len(norms),
            "newton_schulz_dtype": newton_schulz_dtype
        }
    }


def test_norm_criterion_allows_newton_schulz_rounding_only_after_the_first_update():
    """Newton-Schulz in fp16 (a CPU with AVX512-FP16 runs it so, as a GPU does) moves the weights, so the fp32
    cases' later norms, 4.6e-5 off the fp64 reference's on a right engine: allowed from step 2 on. The first norm
    comes before any update: held to fp32's tolerance, as is every norm when Newton-Schulz ran in fp32."""
    assert problems("Muon_zero1_fp32", muon_result([1.0 + 3e-8, 1.0 + 4.6e-5, 1.0 - 1.4e-5], "float16")) == []
    assert problems("Muon_zero1_fp32", muon_result([1.0 + 4.6e-5, 1.0, 1.0],
                                                   "float16")) == ["2x4: step 1 norm 1.0000, the gradient's 1.0000"]
    assert problems("Muon_zero1_fp32", muon_result([1.0, 1.0 + 4.6e-5, 1.0],
                                                   "float32")) == ["2x4: step 2 norm 1.0000, the gradient's 1.0000"]
    assert problems("Muon_zero1_fp32", muon_result([1.0, 4.6, 1.0],
                                                   "float16")) == ["2x4: step 2 norm 4.6000, the gradient's 1.0000"]
