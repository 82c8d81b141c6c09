# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The ``prefixes`` tier: every PR bundle applied in series order on pristine upstream, and after each,
that patch's own upstream-style test run on the tree built so far. A PR is merged on its own, before
the ones after it: its fix and test must hold with only the bundles before it applied (a test that
passes only thanks to a later patch would fail upstream's CI).

The tree of prefix k is a git tree of the pristine sdist with bundles 1..k applied by ``git am`` (the
mboxes of ``tools/patches.py export-prs``, overlay files included). Its ``deepspeed/`` directory holds
exactly the files a wheel of it installs (the sdist ships the generated version file and the copies of
``csrc/`` and ``op_builder/``), so the prefix runs as a copy of that directory put first on the pristine
interpreter's ``PYTHONPATH``: no wheel build per prefix. Ops JIT-build from the prefix's own sources (at
one path for every prefix, so an op whose sources did not change is not rebuilt).
"""

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from patch_facts import patch_name
from upstream_suite import patch_tests
from upstream_suite.execute import Side
from upstream_suite.outcomes import kind_of
from toolkit import tables


@dataclass(frozen=True)
class Prefix:
    number: str  # the patch that ends the prefix, "0009"
    bundle: Path  # its PR bundle directory (pr.mbox, description.md)
    tests: tuple  # the PatchTests that patch adds


def prefixes(bundles, tests, not_for_upstream):
    """One Prefix per bundle, in series order; the fork's own patches (no test) are applied, not tested."""
    by_patch = {}
    for test in tests:
        by_patch.setdefault(test.number, []).append(test)
    return [
        Prefix(bundle.name[:4], bundle, tuple(by_patch.get(bundle.name[:4], ()))) for bundle in bundles
        if bundle.name[:4] not in not_for_upstream
    ]


def mbox_digest(bundles):
    """Changes when any bundle up to the last of ``bundles`` does: part of a prefix's result identity."""
    sha = hashlib.sha256()
    for bundle in bundles:
        sha.update((Path(bundle) / "pr.mbox").read_bytes())
    return sha.hexdigest()


def package_copy(tree, target):
    """Copy the prefix tree's ``deepspeed/`` package to ``target/deepspeed``; return ``target``."""
    target = Path(target)
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(Path(tree) / "deepspeed", target / "deepspeed", ignore=shutil.ignore_patterns("__pycache__"))
    return target


def side_of(prefix, python, site, extensions_dir):
    """The Side that runs ``prefix``: the pristine interpreter with the prefix's package first on its path."""
    return Side(f"prefix-{prefix.number}",
                python,
                Path(extensions_dir),
                str(Path(site) / "deepspeed"),
                environ={"PYTHONPATH": str(site)})


def verdict(prefix, outcomes):
    """(outcomes of the prefix's tests, ok): ok when every one of its test files ran and every case that ran passed.
    A skipped case (one that needs a device this machine lacks) is no evidence either way; a patch whose every case
    skipped is not ok, and ``every_case_skipped`` tells it from a failure."""
    paths = {test.path for test in prefix.tests}
    mine = {test_id: result["outcome"] for test_id, result in outcomes.tests.items() if result["unit"] in paths}
    ran_every_file = paths <= {result["unit"] for result in outcomes.tests.values()}
    ran = {test_id: outcome for test_id, outcome in mine.items() if kind_of(outcome) != "skip"}
    return mine, ran_every_file and patch_tests.all_passed(ran)


def every_case_skipped(outcomes):
    """Whether ``outcomes`` ({test id: outcome}) holds cases and every one skipped: the prefix proved nothing here."""
    return bool(outcomes) and all(kind_of(outcome) == "skip" for outcome in outcomes.values())


def verdict_text(outcomes, ok):
    if ok:
        return "passes"
    return "not run here (every case skipped)" if every_case_skipped(outcomes) else "**FAILS**"


def as_markdown(rows):
    lines = [
        *tables.header(["the series up to", "its upstream-style test", "outcome on that prefix", "verdict"]),
    ]
    for prefix, outcomes, ok in rows:
        files = "; ".join(f"`tests/{test.path}`" for test in prefix.tests) or "(none)"
        lines.append(
            f"| {patch_name(prefix.bundle.name)} | {files} | {patch_tests.tally(outcomes)} | {verdict_text(outcomes, ok)} |"
        )
    return "\n".join(lines)


def units(prefix):
    return patch_tests.units(prefix.tests)
