# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Every fp32 master weight of an engine, whole, on the host: what its optimizer updates, on any engine path."""

import torch

from deepspeed.utils import safe_get_full_fp32_param


def zero_master_weights(engine, dtype=torch.float64):
    """``{name: tensor}`` as ``dtype``: ZeRO's fp32 master weights, gathered (a collective per parameter); without
    ZeRO the module's own parameters. Public DeepSpeed APIs only, so pristine upstream runs it too."""
    weights = {}
    for name, param in engine.module.named_parameters():
        full = safe_get_full_fp32_param(param)
        weights[name] = (param if full is None else full).detach().to("cpu", dtype).clone()
    return weights


def master_weights(engine, dtype=torch.float64):
    """``{name: tensor}`` as ``dtype`` (ZeRO partitions gathered: a collective per parameter); fp16 without ZeRO
    keeps its fp32 copies beside the fp16 parameters (ds_gas_check's ownership.low_to_master finds them)."""
    from deepspeed.gafix.gas_check.ownership import low_to_master
    masters = low_to_master(engine.optimizer)
    weights = {}
    for name, param in engine.module.named_parameters():
        full = safe_get_full_fp32_param(param)
        if full is None:
            full = masters.get(id(param), param)
        weights[name] = full.detach().to("cpu", dtype).clone()
    return weights
