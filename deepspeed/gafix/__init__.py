# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""deepspeed-gafix: DeepSpeed with gradient accumulation you can trust.

``PATCHES`` lists the ``(file name, subject)`` of each patch to upstream built into this wheel, in
the order they were applied; ``UPSTREAM_VERSION``/``UPSTREAM_SHA256`` name the upstream sdist.
"""

from ._build_info import OVERLAY, PATCHES, UPSTREAM_SHA256, UPSTREAM_VERSION

__all__ = ["OVERLAY", "PATCHES", "UPSTREAM_SHA256", "UPSTREAM_VERSION"]
