# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The upstream-style tests that the patches carry: files a patch adds under ``tests/`` (upstream's
``tests/unit/...`` layout, DistributedTest and its fixtures), so that ``git am`` of one patch brings fix
and test together. The runner's ``patch-tests`` tier lays them into its copy of upstream's tests and
runs them on both sides: each patch's test must fail on pristine upstream and pass on the fork.
"""

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from patch_facts import patch_name
from upstream_suite.execute import Unit
from upstream_suite.outcomes import kind_of
from toolkit import tables

_DIFF = re.compile(r"^diff --git a/(\S+) b/(\S+)$")
_HUNK = re.compile(r"^@@ -0,0 \+1(?:,(\d+))? @@")
TESTS_PREFIX = "tests/"


@dataclass(frozen=True)
class PatchTest:
    patch: str  # the patch file's stem, "0003-Count-every-..."
    path: str  # relative to the tests directory: "unit/runtime/test_....py"
    content: str

    @property
    def number(self):
        return self.patch.split("-", 1)[0]

    @property
    def name(self):
        """The patch's name: its stem without the number, which a reordered series changes."""
        return patch_name(self.patch)


class PatchTestError(Exception):
    """A patch whose added test file cannot be read back from its diff (the message names both)."""


def _new_files(patch_text, patch_name):
    """({path: content} of the files a format-patch diff creates, [paths it changes otherwise])."""
    files, changed, lines, i = {}, [], patch_text.split("\n"), 0
    while i < len(lines):
        match = _DIFF.match(lines[i])
        i += 1
        if not match:
            continue
        path = match.group(2)
        header = []
        while i < len(lines) and not lines[i].startswith("@@") and not _DIFF.match(lines[i]):
            header.append(lines[i])
            i += 1
        if not any(line.startswith("new file mode") for line in header):
            changed.append(path)
            continue
        hunk = _HUNK.match(lines[i]) if i < len(lines) else None
        if hunk is None:
            raise PatchTestError(f"{patch_name}: the new file {path} has no single hunk from line 1")
        count = int(hunk.group(1) or 1)
        body = lines[i + 1:i + 1 + count]
        if len(body) < count or any(not line.startswith("+") for line in body):
            raise PatchTestError(f"{patch_name}: the new file {path} is cut short in its diff")
        i += 1 + count
        content = "\n".join(line[1:] for line in body)
        missing_newline = i < len(lines) and lines[i].startswith("\\ No newline at end of file")
        files[path] = content if missing_newline else content + "\n"
    return files, changed


def patch_tests(patch_paths):
    """The test files each patch adds below tests/, in series order."""
    found = []
    for patch_path in patch_paths:
        patch_path = Path(patch_path)
        files, changed = _new_files(patch_path.read_text(), patch_path.name)
        for path in changed:
            if path.startswith(TESTS_PREFIX):
                # Each patch's test is its own file, whole in the patch that adds it.
                raise PatchTestError(f"{patch_path.name} changes {path}, which an earlier patch added: give it a "
                                     "test file of its own")
        for path, content in files.items():
            if path.startswith(TESTS_PREFIX) and Path(path).name.startswith("test_"):
                found.append(PatchTest(patch_path.stem, path[len(TESTS_PREFIX):], content))
    return found


def units(tests):
    return [Unit(test.path) for test in tests]


def digest(tests):
    """Changes whenever a patch's test does: part of the scratch tree's stamp."""
    sha = hashlib.sha256()
    for test in tests:
        sha.update(f"{test.path}\0{test.content}\0".encode())
    return sha.hexdigest()


def lay_into(tests, tests_dir):
    """Write the tests into a copy of upstream's tests directory, refusing to overwrite one of its files
    (a patch's test is a new file upstream too)."""
    for test in tests:
        target = Path(tests_dir) / test.path
        if target.exists() and target.read_text() != test.content:
            raise PatchTestError(f"{test.patch}: {test.path} exists in upstream's tests already")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(test.content)


def verdicts(tests, fork_tests, pristine_tests):
    """Per patch test file: (test, pristine outcomes, fork outcomes, ok). ok: at least one test of the file
    fails on pristine (a test that pristine passes proves nothing) and the fork passes every one that it runs;
    a case skipped on both sides (one that needs a device this machine lacks) is no evidence either way, and
    the others decide."""
    rows = []
    for test in tests:

        def outcomes(side):
            return {test_id: result["outcome"] for test_id, result in side.items() if result["unit"] == test.path}

        fork, pristine = outcomes(fork_tests), outcomes(pristine_tests)
        pristine_fails = any(kind_of(outcome) == "bad" for outcome in pristine.values())
        skipped = skipped_on_both(pristine, fork)
        ran = {test_id: outcome for test_id, outcome in fork.items() if test_id not in skipped}
        rows.append((test, pristine, fork, all_passed(ran) and pristine_fails))
    return rows


def skipped_on_both(pristine, fork):
    """The test ids that skip on both sides ({test id: outcome} each)."""
    return {
        test_id
        for test_id, outcome in fork.items()
        if kind_of(outcome) == "skip" and kind_of(pristine.get(test_id, "")) == "skip"
    }


def all_passed(outcomes):
    """Whether ``outcomes`` ({test id: outcome}) holds at least one test and every one passed."""
    return bool(outcomes) and all(kind_of(outcome) == "ok" for outcome in outcomes.values())


def tally(outcomes):
    """"2 failed, 1 passed" ({test id: outcome}), or "not run"."""
    counts = {}
    for outcome in outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return ", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items())) or "not run"


def as_markdown(rows):
    lines = [*tables.header(["patch", "its upstream-style test", "pristine 0.19.8", "fork", "verdict"])]
    for test, pristine, fork, ok in rows:
        verdict = "fails on pristine, passes on the fork" if ok else "**NOT PROVEN**"
        skipped = len(skipped_on_both(pristine, fork))
        if ok and skipped:
            verdict += f" ({skipped} skipped on both)"
        lines.append(f"| {test.name} | `tests/{test.path}` | {tally(pristine)} | {tally(fork)} | {verdict} |")
    return "\n".join(lines)
