# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The fork's own pip extras, added to upstream's when its setup.py runs.

``pip install ".[hf]"`` installs the transformers and accelerate versions the fork is tested with,
listed in ``requirements-hf.txt``; ``.[plot]`` matplotlib, for ``ds_gas_check --plot``
(``requirements-plot.txt``). tests/requirements.txt reads the same files.
"""

import functools
from pathlib import Path

from .errors import BuildError

EXTRAS = {"hf": "requirements-hf.txt", "plot": "requirements-plot.txt"}


def read_extras(repo):
    """``{extra: [requirement, ...]}`` from the files named in EXTRAS, comments and blank lines left out."""
    extras = {}
    for extra, name in EXTRAS.items():
        path = Path(repo) / name
        if not path.is_file():
            raise BuildError(f"{name}: no such file (it lists the requirements of the '{extra}' extra)")
        lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
        extras[extra] = [line for line in lines if line]
    return extras


def with_extras(setup, extras):
    """``setup`` with ``extras`` added to the ``extras_require`` it is called with; refuses to replace one."""

    @functools.wraps(setup)
    def setup_with_extras(**kwargs):
        merged = dict(kwargs.get("extras_require") or {})
        taken = sorted(set(merged) & set(extras))
        if taken:
            raise BuildError(f"upstream's setup.py already defines the extra(s) {taken}: rename ours in "
                             "gafix_build/extras.py")
        merged.update(extras)
        return setup(**dict(kwargs, extras_require=merged))

    return setup_with_extras
