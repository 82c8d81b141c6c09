# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The CUDA quantizer of ZeRO++ against the pure-torch one the CPU tests run it as (``helpers/torch_quantizer.py``;
skipped without a CUDA device).

tests/test_zeropp.py checks qgZ and qwZ on CPU ranks through upstream's pure-torch implementation of the quantizer's
wire format, made to round as the CUDA kernel does. Here each implementation quantizes and dequantizes the same fp16
tensors on one GPU, with the calls ZeRO++ makes: qwZ's 8-bit ``quantize`` / ``dequantize``, and qgZ's 4-bit
``swizzle_quant``, ``quantized_reduction`` over a node of 2 ranks and ``dequantize``. Their results must agree within
one quantization code on a few elements (a tie rounded the other way) and exactly on the rest.
"""

import pytest
import torch

from helpers.torch_quantizer import rounding_quantizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

ROWS = COLUMNS = 1024
DEVICES_PER_NODE = 2
MISMATCHED_SHARE = 1e-3  # elements a code apart (ties, fp16 sums in another order)


@pytest.fixture(scope="module")
def implementations():
    from deepspeed.ops.op_builder import QuantizerBuilder
    return {"cuda": QuantizerBuilder().load(), "torch": rounding_quantizer()}


def gradients():
    """fp16 values whose magnitude changes from row to row, so that groups get different scales."""
    gen = torch.Generator().manual_seed(0)
    values = torch.randn(ROWS, COLUMNS, generator=gen) * torch.logspace(-3, 1, ROWS).view(-1, 1)
    return values.half().cuda()


def assert_agree(cuda, mine, step):
    """The two results agree exactly but on a few elements, those within one ``step`` (per element)."""
    gap = (cuda.float() - mine.float()).abs()
    off = gap > 1e-3 * step
    assert off.float().mean() <= MISMATCHED_SHARE, f"{int(off.sum())} of {gap.numel()} elements differ"
    assert bool((gap <= step * 1.001).all()), f"largest gap {float((gap / step).max()):.3f} steps"


def test_cuda_qwz_round_trip_matches_torch_quantizer(implementations):
    values, groups = gradients().view(-1), ROWS
    out = {}
    for name, op in implementations.items():
        quantized, scales = op.quantize(values, groups, 8, op.Symmetric)
        out[name] = op.dequantize(quantized, scales, scales.numel(), 8, op.Symmetric).view(-1)
    step = (values.float().view(groups, -1).abs().amax(dim=1) / 128).repeat_interleave(values.numel() // groups)
    assert_agree(out["cuda"], out["torch"], step)
    # and the round trip is the quantization's: within a step (a group's largest value, clamped to code 127)
    assert bool(((out["torch"].float() - values.float()).abs() <= step * 1.001 + values.float().abs() * 2**-10).all())


def test_cuda_qgz_reduction_matches_torch_quantizer(implementations):
    values = gradients()
    in_groups = max(ROWS, COLUMNS)  # as all_to_all_quant_reduce chooses them
    out_groups = in_groups // DEVICES_PER_NODE
    out = {}
    for name, op in implementations.items():
        quantized, scales = op.swizzle_quant(values, in_groups, 4, op.Symmetric, 1, 1, DEVICES_PER_NODE)
        # The node's two ranks' shares as the intra-node all-to-all would hand them to one rank: here one tensor's
        # two halves, summed and quantized again.
        reduced, reduced_scales = op.quantized_reduction(quantized, scales, in_groups, out_groups, 4, op.Symmetric,
                                                         DEVICES_PER_NODE)
        out[name] = op.dequantize(reduced, reduced_scales, reduced_scales.numel(), 4, op.Symmetric).float().view(-1)
    per_group = out["torch"].numel() // out_groups
    step = (out["torch"].view(out_groups, -1).abs().amax(dim=1) / 8).repeat_interleave(per_group)
    assert_agree(out["cuda"], out["torch"], step)
