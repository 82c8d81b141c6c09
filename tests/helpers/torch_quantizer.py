# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ZeRO++'s quantizer (a CUDA op) on any device: upstream's pure-torch implementation of its wire format (the NPU
accelerator's, ``op_builder/npu/quantizer.py``), made to round as the CUDA kernel does (``__float2int_rn``: to nearest;
0.19.8's NPU implementation truncates toward zero, patch Round-ZeRO-s-NPU-quantizer-to-nearest-as-the-CUDA-ke, and
pristine runs these tests too) and to hand back ``quantize``'s scales flat (the shape of the buffer ZeRO-3 gathers them
into: gloo checks it, NCCL does not). ``tests/test_quantizer_wire.py`` holds it against the CUDA op on a GPU."""


def rounding_quantizer():
    """The quantizer class: ``quantize``, ``dequantize``, ``swizzle_quant`` and ``quantized_reduction`` as the CUDA
    op's. Sets the NPU implementation's rounding for the whole process."""
    from deepspeed.ops.op_builder.npu.quantizer import NPUQuantizer

    def quantize_groups(xg, num_bits):
        maxv = xg.abs().max(dim=1).values
        scale = (float(1 << num_bits)) / (2.0 * maxv)
        scale.masked_fill_(maxv == 0, 1.0)
        limit = 1 << (num_bits - 1)
        xg.mul_(scale.view(-1, 1)).round_().clamp_(-limit, limit - 1)
        return xg, scale.reciprocal().view(-1)

    class Quantizer(NPUQuantizer):

        @staticmethod
        def quantize(input_vals, groups, num_bits, quant_type):
            quantized, scales = NPUQuantizer.quantize(input_vals, groups, num_bits, quant_type)
            return quantized, scales.view(-1)

    NPUQuantizer._quantize_groups = staticmethod(quantize_groups)
    return Quantizer


def use_torch_quantizer():
    """``rounding_quantizer()`` wherever ZeRO++ loads the CUDA op (the module-level caches of qgZ and qwZ)."""
    from deepspeed.runtime.comm import coalesced_collectives
    from deepspeed.runtime.zero.partition_parameters import CUDAQuantizer
    quantizer = rounding_quantizer()
    coalesced_collectives.quantizer_module = quantizer
    CUDAQuantizer.quantizer_cuda_module = quantizer
