# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""An interpreter with pristine upstream deepspeed (the venv ``tools/test-against-upstream`` builds), on the
same torch and Python as the fork that runs the tests."""

from toolkit import sides


def pristine_python():
    """Path of that venv's python, building the venv on first use (about a minute here; longer for a CUDA torch)."""
    return sides.pristine_python()
