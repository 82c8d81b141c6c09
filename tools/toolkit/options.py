# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The command-line options every tool and benchmark comparing the two sides spells the same way."""

import sys

PRISTINE_HELP = ("interpreter with pristine upstream deepspeed (default: the venv tools/test-against-upstream "
                 "builds on the fork's torch and Python)")


def add_sides(parser, fork=True, pristine_help=PRISTINE_HELP):
    """``--fork-python`` (default: this interpreter) and ``--pristine-python`` (default: None, for
    ``toolkit.sides.pristine_python`` to find or build)."""
    if fork:
        parser.add_argument("--fork-python",
                            default=sys.executable,
                            help="interpreter with the fork installed (default: this one)")
    parser.add_argument("--pristine-python", help=pristine_help)


def add_extensions_dir(parser, default=None, per_side=False):
    """``--extensions-dir``: the TORCH_EXTENSIONS_DIR whose JIT-built ops a run reuses."""
    where = "one subdirectory per side" if per_side else "the ops the same install built already"
    parser.add_argument("--extensions-dir",
                        default=default,
                        help=f"TORCH_EXTENSIONS_DIR to reuse ({where}; default: {default or 'a fresh one'})")


def add_report_only(parser, help="run nothing: rewrite the report from its results file"):
    parser.add_argument("--report-only", action="store_true", help=help)
