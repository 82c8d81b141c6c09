# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How far a run continued from a checkpoint is from the run that wrote it and went on (the checkpoint tests)."""

# Relative tolerance of the weights after the continued steps, by what the engine computes in, where the two runs
# may round differently (another install, another split of the global batch): bf16 and fp16 rounding.
TOLERANCE = {"fp32": 0.0, "bf16": 2e-2, "fp16": 2e-3}


def dtype_of(config):
    """The precision a configuration's name says it trains in."""
    return next((name for name in ("bf16", "fp16") if name in config), "fp32")


def relative_error(expected, got):
    """max |got - expected| / max |expected| over the weights (fp64 tensors)."""
    return ((got - expected).abs().max() / expected.abs().max()).item()
