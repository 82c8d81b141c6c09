# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Where the repository names a patch by its number instead of its name (``tools/patches.py check``).

A patch's number is its place in ``patches/series``: a rebase that reorders the series, or a patch that goes
upstream, changes it, and every "patch NNNN" in prose then points at another patch without a word. Its name (the
file name without the number) stays. Found, where NNNN is a number of the series: "patch NNNN", "patches NNNN and
NNNN", a range "NNNN-NNNN" or pair "NNNN/NNNN", and in Markdown prose (outside code) a number standing alone.
Left alone: the reports the tools write under ``docs/evidence/<run>/``, test data, and the diffs of the patches (their
messages are read).
"""

import re

from toolkit import REPO
from toolkit.files import repo_files

TEXT_FILES = re.compile(r"\.(md|py|toml|json|txt|patch)$|^tools/[\w-]+$|^\.ci/")
LEFT_ALONE = re.compile(r"^(docs/evidence/[^/]+/|tests/data/)")
_NUMBER = r"0\d{3}"
_AFTER_THE_WORD = re.compile(rf"\b[Pp]atch(?:es)? ({_NUMBER}(?:(?:, and |, | and | or ){_NUMBER})*)\b")
_RANGE_OR_PAIR = re.compile(rf"(?<![\w.:/#`-])({_NUMBER})[-–/]({_NUMBER})(?![\w.`])")
_ALONE = re.compile(rf"(?<![\w.:/#`-])({_NUMBER})(?![\w.`])")
_CODE_SPAN = re.compile(r"`[^`]*`")


def _prose_of_markdown(text):
    """(line number, line) outside fenced blocks, with code spans blanked."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            yield number, _CODE_SPAN.sub("``", line)


def _message_of_patch(text):
    head = text.split("\n---\n", 1)[0]
    return head.splitlines()


def mentions(path, text, numbers):
    """``[(line number, the words)]`` where ``text`` (the file ``path``) names one of ``numbers`` by number."""
    found = []
    lines = _message_of_patch(text) if path.endswith(".patch") else text.splitlines()
    for number, line in enumerate(lines, 1):
        for match in _AFTER_THE_WORD.finditer(line):
            if any(n in numbers for n in re.findall(_NUMBER, match.group(1))):
                found.append((number, match.group(0)))
        found += [(number, match.group(0)) for match in _RANGE_OR_PAIR.finditer(line)
                  if match.group(1) in numbers and match.group(2) in numbers]
    if path.endswith(".md"):
        found += [(number, match.group(0)) for number, line in _prose_of_markdown(text)
                  for match in _ALONE.finditer(line) if match.group(1) in numbers]
    return sorted(set(found))


def numbered_mentions(repo=REPO):
    """Every place of the repository's tracked text that names a patch by number, as sentences."""
    from gafix_build import read_series
    numbers = {patch.name[:4] for patch in read_series(repo)}
    found = []
    for path in repo_files(repo):
        if not TEXT_FILES.search(path) or LEFT_ALONE.match(path) or not (repo / path).is_file():
            continue
        text = (repo / path).read_text(errors="replace")
        found += [
            f"{path}:{line}: names a patch by its number ({words!r}): name it by its name"
            for line, words in mentions(path, text, numbers)
        ]
    return found
