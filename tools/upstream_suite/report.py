# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The comparison as Markdown (for people and docs/) and JSON (every test, for tools)."""

import json
from collections import Counter, defaultdict

from upstream_suite.classify import (BOTH_FAIL, BOTH_PASS, BOTH_SKIP, CATEGORIES, EXPLAINED, FIXED, ONLY_FORK,
                                     REGRESSION)
from upstream_suite.classify import category_counts, side_counts
from toolkit import tables


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")


def _unit_of(test_id):
    return test_id.split("::", 1)[0]


def as_markdown(title, identity, rows, fork_tests, pristine_tests, pristine_source):
    counts = category_counts(rows)
    fork, pristine = side_counts(fork_tests), side_counts(pristine_tests)
    lines = [f"## {title}", ""]
    lines += [
        f"- fork: deepspeed {identity['fork_version']}; pristine: deepspeed {identity['pristine_version']} "
        f"({pristine_source})"
    ]
    lines += [f"- upstream tests tree sha256 {identity['tests_sha256'][:16]}..., torch {identity['torch']}"]
    lines += ["", *tables.header(["side", "run", "passed", "failed", "skipped"])]
    for name, side in (("fork", fork), ("pristine", pristine)):
        lines.append(f"| {name} | {side['run']} | {side['passed']} | {side['failed']} | {side['skipped']} |")
    lines += ["", *tables.header(CATEGORIES)]
    lines.append("| " + " | ".join(str(counts[category]) for category in CATEGORIES) + " |")
    differ = [row for row in rows if row.fork_reason]
    if differ:
        lines += [
            "", f"{len(differ)} of the {counts[BOTH_FAIL]} tests that fail on both sides fail otherwise on "
            "the fork (another outcome or reason, numbers aside): listed below."
        ]

    per_file = defaultdict(Counter)
    for row in rows:
        per_file[_unit_of(row.test_id)][row.category] += 1
    lines += ["", *tables.header(["test file", *CATEGORIES])]
    for name in sorted(per_file):
        lines.append(f"| {name} | " + " | ".join(str(per_file[name][category]) for category in CATEGORIES) + " |")

    for category, heading in ((REGRESSION, "Regressions"), (EXPLAINED, "Explained (patches/facts.toml)"),
                              (FIXED, "Fixed by the fork"), (BOTH_FAIL, "Both fail"),
                              (ONLY_FORK, "Only on the fork (no pristine outcome)")):
        chosen = [row for row in rows if row.category == category]
        if not chosen:
            continue
        lines += ["", f"### {heading} ({len(chosen)})", "", *tables.header(["test", "fork", "pristine", "reason"])]
        for row in chosen:
            lines.append(
                f"| `{_cell(row.test_id)}` | {row.fork or '-'} | {row.pristine or '-'} | {_cell(row.reason)} |")

    if differ:
        lines += [
            "", f"### Both fail, the fork otherwise ({len(differ)})", "",
            "Not regressions (pristine does not pass them), but the fork fails them another way: each deserves a "
            "look, for it could fail earlier than pristine, or at a check pristine never reaches.", "",
            *tables.header(["test", "fork", "pristine"])
        ]
        for row in differ:
            lines.append(
                f"| `{_cell(row.test_id)}` | {_cell(row.fork_reason)} | {row.pristine}: {_cell(row.reason)} |")

    skips = Counter(row.reason for row in rows if row.category == BOTH_SKIP)
    if skips:
        lines += ["", f"### Both skip ({counts[BOTH_SKIP]}), by reason", "", *tables.header(["tests", "reason"])]
        for reason, number in skips.most_common():
            lines.append(f"| {number} | {_cell(reason) or '-'} |")
    lines += ["", f"{counts[BOTH_PASS]} tests pass on both sides.", ""]
    return "\n".join(lines)


def as_json(identity, rows, fork_tests, pristine_tests, pristine_source):
    return json.dumps(
        {
            "identity": identity,
            "pristine_source": pristine_source,
            "sides": {
                "fork": side_counts(fork_tests),
                "pristine": side_counts(pristine_tests)
            },
            "categories": category_counts(rows),
            "both_fail_otherwise_on_the_fork": sum(1 for row in rows if row.fork_reason),
            "tests": {
                row.test_id: {
                    "category": row.category,
                    "fails_otherwise_on_the_fork": bool(row.fork_reason),
                    "fork": fork_tests.get(row.test_id),
                    "pristine": pristine_tests.get(row.test_id),
                }
                for row in rows
            },
        },
        indent=1,
        sort_keys=True)
