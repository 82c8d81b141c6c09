# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Build-time helpers of deepspeed-gafix: pinned upstream sdist -> patched tree -> overlay.

Used by ``setup.py`` and ``tools/patches.py``; never installed.
"""

from .errors import BuildError
from .pin import Pin, load_pin
from .sdist import obtain_sdist
from .series import Patch, read_series
from .assemble import assemble_tree
from .extras import read_extras, with_extras
from .supported import with_supported_versions

__all__ = [
    "BuildError", "Pin", "load_pin", "obtain_sdist", "Patch", "read_series", "assemble_tree", "read_extras",
    "with_extras", "with_supported_versions"
]
