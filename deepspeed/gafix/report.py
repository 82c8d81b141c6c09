# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The ``ds_report`` section that says which fork build and which patches are running, and how each op is loaded."""

import os

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


def op_state(builder, installed, extensions_root):
    """How this install loads ``builder``'s op: upstream's table above says "installed" only of an op prebuilt
    into the wheel, and "NO" of one an earlier run JIT-built and cached, which loads in a second."""
    if installed:
        return "prebuilt into the wheel"
    if not builder.is_compatible(verbose=False):
        return "cannot be built here (its compatibility above says why)"
    from torch.utils.cpp_extension import LIB_EXT
    name = builder.jit_name()
    if extensions_root and os.path.exists(os.path.join(extensions_root, name, name + LIB_EXT)):
        return f"JIT-built, cached in {os.path.join(extensions_root, name)}"
    return "not built yet: JIT-built on first use (1 to 3 minutes), then cached"


def extensions_root():
    """torch's JIT build root (TORCH_EXTENSIONS_DIR, or its per-user default), or None where torch cannot say."""
    try:
        from torch.utils.cpp_extension import _get_build_directory
        return _get_build_directory("", verbose=False)
    except (ImportError, OSError):
        return None


def op_lines():
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    root = extensions_root()
    same_accelerator = accelerator_name == get_accelerator()._name
    lines = ["-" * _WIDTH, "ops, as this install loads them", "-" * _WIDTH]
    for name, builder in ALL_OPS.items():
        if builder is None or name == "deepspeed_not_implemented":
            continue
        installed = bool(installed_ops.get(name, False)) and same_accelerator
        lines.append(_dotted(name, op_state(builder, installed, root)))
    return lines


def _dotted(name, value, dots=23):
    return f"{name} {'.' * (dots - len(name))} {value}"


def print_fork_report(ops=True):
    print("\n".join(fork_report_lines() + (op_lines() if ops else [])))
