# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Compare the two sides test by test.

A test is a **regression** when the fork does worse than pristine upstream: fails (or errors, times
out, crashes) where pristine passes or skips, skips where pristine passes, or is missing where pristine
has an outcome (the fork could not even collect it). Losing a passing test to a skip counts: the gate
must never turn a lost check into a green line. One exception to "missing": a file pristine could not
collect at all (its one outcome is the file's collection error) whose tests the fork collects is not
missing on the fork: it is fixed when they all pass there, a both-fail otherwise.
"""

import re
from collections import Counter
from dataclasses import dataclass

from upstream_suite.outcomes import kind_of

REGRESSION = "regression"
FIXED = "fixed"
BOTH_FAIL = "both fail"
BOTH_SKIP = "both skip"
BOTH_PASS = "both pass"
ONLY_FORK = "only on the fork"  # pristine has no outcome: e.g. a test of a unit pristine was not asked to run
# A regression by the rules above whose exact pair of outcomes patches/facts.toml explains ([[explained]]): a patch
# changed the outcome for the better (e.g. pristine passed only because of the noise the patch removed).
EXPLAINED = "explained"
CATEGORIES = (REGRESSION, EXPLAINED, FIXED, BOTH_FAIL, BOTH_SKIP, BOTH_PASS, ONLY_FORK)


@dataclass(frozen=True)
class Row:
    test_id: str
    category: str
    fork: str  # outcome, or "" when absent
    pristine: str
    reason: str  # the reason that explains the category (the fork's for a regression)
    # Both fail, but not alike: the fork's outcome and reason, where they differ from pristine's. Not a
    # regression (pristine does not pass either), yet the fork may fail earlier or elsewhere: the report lists
    # these apart.
    fork_reason: str = ""


# Numbers and addresses in a failure's first line (a memory figure, a port, an object's id) differ from run
# to run, and each side's files lie in its own environment; the rest of the line (the file inside the package
# included) says where and why the test failed.
_RUN_SPECIFIC = re.compile(r"0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:e[-+]?\d+)?")
_ENVIRONMENT = re.compile(r"[^\s'\"(]*/site-packages/")


def same_failure(ours, theirs):
    """Whether both sides ended a test alike: the same outcome and the same reason, numbers and addresses
    aside."""

    def general(result):
        return _RUN_SPECIFIC.sub("#", _ENVIRONMENT.sub("site-packages/", result["reason"] or ""))

    return ours["outcome"] == theirs["outcome"] and general(ours) == general(theirs)


def category_of(fork, pristine):
    if pristine is None:
        return ONLY_FORK
    theirs = kind_of(pristine)
    if fork is None:
        return REGRESSION if theirs != "skip" else BOTH_SKIP
    ours = kind_of(fork)
    if ours == theirs:
        return {"ok": BOTH_PASS, "bad": BOTH_FAIL, "skip": BOTH_SKIP}[ours]
    if ours == "bad" or (ours == "skip" and theirs == "ok"):
        return REGRESSION
    if ours == "ok":
        return FIXED
    return BOTH_FAIL  # fork skips where pristine fails: neither passes


def compare(fork_tests, pristine_tests, explained=None):
    """Rows for every test id either side has, sorted by id. ``*_tests`` map id -> {outcome, reason}; ``explained``:
    {test id: (fork outcome, pristine outcome, why)}, regressions with exactly that pair of outcomes."""
    explained = explained or {}
    rows = []
    for test_id in sorted(set(fork_tests) | set(pristine_tests)):
        ours, theirs = fork_tests.get(test_id), pristine_tests.get(test_id)
        fork = ours["outcome"] if ours else None
        pristine = theirs["outcome"] if theirs else None
        category = category_of(fork, pristine)
        collected_by_fork = [] if ours is not None or "::" in test_id else [
            result for other, result in fork_tests.items() if other.startswith(test_id + "::")
        ]
        if collected_by_fork and kind_of(pristine) == "bad":
            fork_ok = all(kind_of(result["outcome"]) == "ok" for result in collected_by_fork)
            category = FIXED if fork_ok else BOTH_FAIL
            reason = f"pristine could not collect the file; the fork ran its {len(collected_by_fork)} test(s): " + (
                theirs["reason"] or "")
        elif ours is None:
            reason = "not collected on the fork"
        elif category in (REGRESSION, ONLY_FORK) or theirs is None:
            reason = ours["reason"]
        else:
            reason = theirs["reason"] or ours["reason"]
        if category == REGRESSION and explained.get(test_id, ())[:2] == (fork, pristine):
            category, reason = EXPLAINED, explained[test_id][2]
        differs = category == BOTH_FAIL and ours is not None and not same_failure(ours, theirs)
        fork_reason = f"{ours['outcome']}: {ours['reason']}" if differs else ""
        rows.append(Row(test_id, category, fork or "", pristine or "", reason, fork_reason))
    return rows


def side_counts(tests):
    """run / passed / failed / skipped of one side (xfailed counts as passed, xpassed as failed)."""
    kinds = Counter(kind_of(result["outcome"]) for result in tests.values())
    return {"run": len(tests), "passed": kinds["ok"], "failed": kinds["bad"], "skipped": kinds["skip"]}


def category_counts(rows):
    counts = Counter(row.category for row in rows)
    return {category: counts[category] for category in CATEGORIES}
