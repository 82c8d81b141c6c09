# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ZeRO++ on ZeRO-3 (patches Average-ZeRO-quantized-gradients-over-every-rank-not,
Keep-frozen-weights-stored-quantized-by-ZeRO-as-they): quantized gradients between nodes (qgZ) and quantized weights
(qwZ, frozen weights stored quantized), each against fp64 PyTorch at every split of one global batch.

tests/workers/zeropp.py (4 ranks seen as 2 nodes of 2; the quantizer as upstream's pure-torch implementation of its
wire format, rounding as the CUDA kernel does): one SGD step without clipping at micro-batch x GAS 4x1, 2x2, 1x4 per
rank. What each promises:

- qwZ: the forward computes with the weights quantized to 8 bits (within one quantization step, fp16 on the wire), so
  the update is exactly the fp64 gradient at the weights each micro-batch's forward used (they differ between
  micro-steps, as the prefetcher groups the gathers differently), averaged.
- qgZ: the gradients cross nodes in 4 bits, so the update is the fp64 gradient of the batch within 4-bit
  quantization (0.11 of its norm seen), its size kept (0.99 seen). 0.19.8 returns it times the ranks of a node (patch
  Average-ZeRO-quantized-gradients-over-every-rank-not) and fails the frozen-weights cases in their first forward
  (patch Keep-frozen-weights-stored-quantized-by-ZeRO-as-they).
"""

import pytest

from helpers.rank_results import assert_norm_matches, assert_update_matches, each_rank, tolerance
from helpers.repo import REPO
from helpers.split_cases import case_id, launches, results

WORKER = REPO / "tests" / "workers" / "zeropp.py"
RANKS = 4
PATHS = ["qgz", "qwz", "qwz_nontrainable", "qgz_qwz"]
SPLITS = [(4, 1), (2, 2), (1, 4)]
CASES = [(RANKS, path, micro, gas) for path in PATHS for micro, gas in SPLITS]
# Relative to the fp64 gradient at the forward's weights: fp32 rounding (5.5e-6 seen) without qgZ; with it, 4-bit
# quantization of every rank's gradient and of each node's sum (0.107 seen).
UPDATE_TOLERANCE = {"qgz": 0.2, "qwz": 2e-5}
NORM_TOLERANCE = {"qgz": 0.05, "qwz": 1e-5}  # the norm kept through qgZ: 1.4% seen
SIZE_TOLERANCE = 0.1  # |applied| / |fp64| - 1 with qgZ: 0.014 seen; 0.19.8's sum over a node's ranks: 0.98
# Steps of 8-bit quantization (a tensor's largest magnitude / 128) between the forward's weights and the weights:
# up to one step, and fp16 on the wire (1.011 seen); without qwZ none.
WEIGHT_STEPS = 1.1


@pytest.fixture(scope="module")
def launched(extensions_dir, request):
    return launches(WORKER, request, extensions_dir)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_update_is_the_fp64_gradient(launched, case):
    """The SGD update over the learning rate against fp64's gradient at the weights each forward used."""
    assert_update_matches(results(launched, case), tolerance(UPDATE_TOLERANCE, case[1]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_norm_matches_fp64_reference(launched, case):
    assert_norm_matches(results(launched, case), tolerance(NORM_TOLERANCE, case[1]))


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_gradient_keeps_its_size(launched, case):
    for rank, result in each_rank(results(launched, case)):
        assert abs(result["gradient_ratio"] - 1) <= SIZE_TOLERANCE, f"rank {rank}: {result}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_forward_weights_are_the_weights_quantized(launched, case):
    """qwZ's forward sees each weight within a quantization step (frozen ones too); without qwZ the weights whole."""
    limit = WEIGHT_STEPS if "qwz" in case[1] else 0.0
    for rank, result in each_rank(results(launched, case)):
        assert result["forward_weight_steps"] <= limit, f"rank {rank}: {result}"
