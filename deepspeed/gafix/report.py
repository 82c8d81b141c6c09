# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The ``ds_report`` section that says which fork build and which patches are running."""

import deepspeed
from deepspeed.gafix import PATCHES, UPSTREAM_SHA256, UPSTREAM_VERSION

_WIDTH = 50


def fork_report_lines():
    lines = [
        "-" * _WIDTH,
        "deepspeed-gafix: DeepSpeed with gradient accumulation fixes",
        "-" * _WIDTH,
        _dotted("version", deepspeed.__version__),
        _dotted("upstream base", f"deepspeed {UPSTREAM_VERSION} (sdist sha256 {UPSTREAM_SHA256[:16]}...)"),
        _dotted("patches", str(len(PATCHES))),
    ]
    lines += [f"  {name}: {subject}" for name, subject in PATCHES]
    return lines


def _dotted(name, value, dots=23):
    return f"{name} {'.' * (dots - len(name))} {value}"


def print_fork_report():
    print("\n".join(fork_report_lines()))
