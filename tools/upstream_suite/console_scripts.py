# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Each side's console scripts: upstream's launcher tests (``unit/launcher/test_user_args.py``) run
``deepspeed`` from PATH, so each side's pytest gets its interpreter's directory first on PATH, as in that
venv activated. A venv copied with ``cp -a`` keeps scripts whose ``#!`` line names the original venv's
python: its ``deepspeed`` would run the other install, so such a side is refused."""

import re
from pathlib import Path

LAUNCHER = "deepspeed"
# pip writes ``#!<python>``, or for a path too long for the kernel ``#!/bin/sh`` then ``'''exec' <python> ...``.
_INTERPRETER = re.compile(r"^(?:#!|'''exec' )(\S+)")


def scripts_dir(python):
    """Where ``python``'s console scripts are: beside it (``python`` as given, a venv's link not resolved)."""
    return Path(python).parent


def interpreter_of(script):
    """The interpreter a pip console script runs, or None when it names none."""
    lines = Path(script).read_text(errors="replace").splitlines()[:2]
    found = [match.group(1) for match in map(_INTERPRETER.match, lines) if match]
    found = [path for path in found if path != "/bin/sh"]
    return found[0] if found else None


def problem(python):
    """Why ``python``'s ``deepspeed`` launcher cannot serve its side's tests, or None."""
    script = scripts_dir(python) / LAUNCHER
    if not script.is_file():
        return (f"{script} is missing: upstream's launcher tests run `{LAUNCHER}` from this side's directory "
                f"(install deepspeed with {python} -m pip)")
    interpreter = interpreter_of(script)
    if interpreter is not None and Path(interpreter).parent != scripts_dir(python):
        return (f"{script} runs {interpreter}, not {python}: a copied venv keeps the original's '#!' lines "
                f"(rewrite them to {scripts_dir(python)}/python3, docs/develop/upstream_suite.md)")
    return None
