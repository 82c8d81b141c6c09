# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Hugging Face Trainer (+ accelerate) on the installed deepspeed vs a plain fp64 PyTorch reference.

``cases`` names the grid, ``tiny_models`` and ``batches`` build the inputs, ``reference`` computes
what every case must apply, ``trainer_run`` trains one case and records what it did apply.
"""
