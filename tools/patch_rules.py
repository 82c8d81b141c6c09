# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""What every patch of the series must carry before it can go upstream (``tools/patches.py check``).

- a ``Signed-off-by:`` trailer (upstream's DCO check rejects a commit without one);
- a ``Test:`` paragraph naming at least one test file that exists: ours (``tests/...py`` in this
  repository) or one the patch itself adds (``tests/unit/...py`` in upstream's tree);
- a CHANGELOG.md entry naming it by its name (its file name without the number);
- for a patch meant for upstream (all but those patches/facts.toml marks "not for upstream"): its own
  upstream-style test, a ``tests/unit/.../test_*.py`` file the patch adds and its ``Test:`` paragraph names, so that
  ``git am`` of the one patch brings fix and test (``tools/run-upstream-suite --tier patch-tests`` runs them).
"""

import re
from pathlib import Path

from patch_facts import patch_name

_TEST_PATH = re.compile(r"\btests/[\w/.-]+\.py\b")
_UPSTREAM_TEST = re.compile(r"^tests/unit/(?:[\w.-]+/)*test_[\w.-]+\.py$")


def message_of(patch_text):
    """The commit message of a ``git format-patch`` file: after the headers, before the diffstat."""
    head = patch_text.split("\n---\n", 1)[0]
    return head.split("\n\n", 1)[1] if "\n\n" in head else ""


def test_paragraph(message):
    """The text from a line starting with ``Test:`` up to the next empty line or trailer."""
    lines, inside = [], False
    for line in message.splitlines():
        if line.startswith("Test:"):
            inside = True
        elif inside and (not line.strip() or line.startswith("Signed-off-by:")):
            break
        if inside:
            lines.append(line)
    return "\n".join(lines)


def files_added(patch_text):
    return set(re.findall(r"^\+\+\+ b/(\S+)$", patch_text, flags=re.MULTILINE))


def problems(patch_path, repo, changelog_text, not_for_upstream=()):
    """What ``patch_path`` lacks, as sentences naming the patch (empty when it carries everything).
    ``not_for_upstream``: the numbers of the fork's own patches (patches/facts.toml), which need no upstream test."""
    patch_path = Path(patch_path)
    text = patch_path.read_text()
    message = message_of(text)
    number = patch_path.name[:4]
    found = []
    if not re.search(r"^Signed-off-by: .+<.+@.+>$", message, flags=re.MULTILINE):
        found.append(f"{patch_path.name}: no Signed-off-by trailer (upstream's DCO check refuses it)")
    named = _TEST_PATH.findall(test_paragraph(message))
    existing = [path for path in named if (Path(repo) / path).is_file() or path in files_added(text)]
    if not existing:
        found.append(f"{patch_path.name}: its message names no existing test file in a 'Test:' paragraph "
                     f"(named: {', '.join(named) or 'none'})")
    own = [path for path in named if _UPSTREAM_TEST.match(path) and path in files_added(text)]
    if number not in not_for_upstream and not own:
        found.append(f"{patch_path.name}: it adds no upstream-style test of its own (a tests/unit/.../test_*.py "
                     "file named in its 'Test:' paragraph)")
    name = patch_name(patch_path.name)
    if name not in changelog_text:
        found.append(f"{patch_path.name}: CHANGELOG.md has no entry naming it ({name})")
    return found
