# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""README.md's two commands, as CI reads them (.ci/run, through tools/readme-command): the first line of the code
block after a ``<!-- command: NAME -->`` marker (``install-and-demo``, ``test``)."""

import shlex
import sys

from toolkit import REPO


class NoCommand(LookupError):
    """README.md has no command of that name."""


def command(name, readme=REPO / "README.md"):
    lines = iter(readme.read_text().splitlines())
    for line in lines:
        if line == f"<!-- command: {name} -->":
            break
    else:
        raise NoCommand(f"{readme} has no <!-- command: {name} --> marker")
    for line in lines:
        if line.startswith("```"):
            found = next(lines, "")
            if found and not found.startswith("```"):
                return found
            break
    raise NoCommand(f"{readme}: no command in the code block after <!-- command: {name} -->")


def pytest_args(readme=REPO / "README.md"):
    """The arguments README's test command gives pytest (``tests -n 2 ...``): a tool that runs the suite as a user
    does (the version matrix) takes them from here."""
    for step in command("test", readme).split("&&"):
        words = shlex.split(step)
        if words[:3] == ["python", "-m", "pytest"]:
            return words[3:]
    raise NoCommand(f"{readme}'s test command runs no `python -m pytest`")


def main(argv):
    """``tools/readme-command NAME``: print README's command NAME; exit 1, naming what is missing, if there is none."""
    try:
        print(command(argv[0]))
    except NoCommand as err:
        print(f"readme-command: {err}", file=sys.stderr)
        return 1
    return 0
