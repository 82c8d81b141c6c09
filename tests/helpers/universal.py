# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""ds_to_universal as the checkpoint tests run it: the installed module, on a checkpoint tag the workers wrote."""

import sys


def to_universal_command(tag_dir, output_dir):
    """The command that converts the tag ``tag_dir`` into a universal checkpoint at ``output_dir`` (``--no_strict``
    and ``--inject_missing_state``: the workers' checkpoints hold no Megatron-style state)."""
    return [
        sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
        str(tag_dir), "--output_folder",
        str(output_dir), "--no_strict", "--inject_missing_state"
    ]
