# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Rank worker: examples/gas_demo.py's split comparison on several engine paths, in one launch."""

import functools

from helpers.rank_cases import run_cases
from helpers.repo import load_script

compare_splits = load_script("examples/gas_demo.py").compare_splits

CONFIGS = {
    "zero0_fp32": (0, "fp32"),
    "zero1_fp32": (1, "fp32"),
    "zero2_fp32": (2, "fp32"),
    "zero3_fp32": (3, "fp32"),
    "zero1_bf16": (1, "bf16"),
}

if __name__ == "__main__":
    run_cases({name: functools.partial(compare_splits, *config) for name, config in CONFIGS.items()})
