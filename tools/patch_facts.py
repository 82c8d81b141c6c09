# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The facts about each patch that its message does not hold (patches/facts.toml), keyed by patch name.

A patch's name is its file name in ``patches/series`` without the number and ``.patch``: the number changes on
a rebase that reorders the series, the name does not. Code asks for facts by the current numbers (``Facts``);
texts in the file write ``{name}`` where they mean a patch, rendered as its name (checked to be one of the series).
"""

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from toolkit import REPO
from gafix_build import read_series

FACTS_FILE = "patches/facts.toml"
NOT_FOR_UPSTREAM = "not for upstream"
TIERS = ("patch", "full")
_NAMED = re.compile(r"\{([^{}]+)\}")


def patch_name(file_name):
    """``0007-Let-the-CPU-....patch`` -> ``Let-the-CPU-...``."""
    return re.sub(r"^\d{4}-", "", file_name).removesuffix(".patch")


@dataclass(frozen=True)
class UpstreamTest:
    path: str
    keyword: str
    tier: str  # "patch" (CI) or "full"
    patches: tuple  # current numbers
    what: str  # rendered: {name} -> name


@dataclass(frozen=True)
class Explained:
    """An upstream test whose outcome a patch changes for the better though the comparison reads a regression: the
    exact pair of outcomes and why. Any other pair of outcomes of that test is compared as usual."""
    test: str
    fork: str
    pristine: str
    patches: tuple  # current numbers
    why: str  # rendered: {name} -> name


@dataclass(frozen=True)
class Facts:
    numbers: dict  # name -> current number ("0007")
    patches: dict  # number -> {"upstream": ..., "overlay": [...], "uncovered": ...}
    upstream_tests: tuple
    explained: tuple = ()

    def explained_outcomes(self):
        """``{test id: (fork outcome, pristine outcome, why)}``, for the comparison."""
        return {entry.test: (entry.fork, entry.pristine, entry.why) for entry in self.explained}

    def not_for_upstream(self):
        return {number for number, facts in self.patches.items() if facts["upstream"] == NOT_FOR_UPSTREAM}

    def overlay(self):
        """``{number: overlay paths}`` of the patches that carry overlay files upstream."""
        return {number: tuple(facts["overlay"]) for number, facts in self.patches.items() if facts.get("overlay")}

    def uncovered(self):
        """``{number: why no upstream test runs its changed lines on a CPU}``."""
        return {number: facts["uncovered"] for number, facts in self.patches.items() if facts.get("uncovered")}

    def upstream(self, number):
        return self.patches[number]["upstream"]

    def tier(self, tier):
        return tuple(test for test in self.upstream_tests if test.tier == tier)


def problems(raw, names):
    """What is wrong in the facts' raw data against the series' patch names, as sentences."""
    found = []
    entries = raw.get("patches", {})
    found += [f"{FACTS_FILE}: no entry for patch {name}" for name in names if name not in entries]
    found += [f"{FACTS_FILE}: [patches.\"{name}\"] names no patch of series" for name in entries if name not in names]
    for name, facts in entries.items():
        if "upstream" not in facts:
            found.append(f"{FACTS_FILE}: [patches.\"{name}\"] has no 'upstream' (its upstream thread and state)")
        unknown = set(facts) - {"upstream", "overlay", "uncovered"}
        if unknown:
            found.append(f"{FACTS_FILE}: [patches.\"{name}\"] has unknown keys {sorted(unknown)}")
    texts = [facts.get("uncovered", "") for facts in entries.values()]
    for index, test in enumerate(raw.get("upstream_tests", []), 1):
        where = f"{FACTS_FILE}: upstream_tests #{index} ({test.get('unit', '?')})"
        if test.get("tier") not in TIERS:
            found.append(f"{where}: tier {test.get('tier')!r}, not one of {', '.join(TIERS)}")
        if not test.get("patches"):
            found.append(f"{where}: names no patch")
        found += [f"{where}: patch {name} is not in series" for name in test.get("patches", []) if name not in names]
        texts.append(test.get("what", ""))
    for index, entry in enumerate(raw.get("explained", []), 1):
        where = f"{FACTS_FILE}: explained #{index} ({entry.get('test', '?')})"
        missing = [key for key in ("test", "fork", "pristine", "patches", "why") if not entry.get(key)]
        if missing:
            found.append(f"{where}: no {', '.join(missing)}")
        found += [f"{where}: patch {name} is not in series" for name in entry.get("patches", []) if name not in names]
        texts.append(entry.get("why", ""))
    for text in texts:
        found += [
            f"{FACTS_FILE}: {{{name}}} in {text[:60]!r}... names no patch" for name in _NAMED.findall(text)
            if name not in names
        ]
    return found


def render(text, numbers):
    """``{name}`` -> the patch's name, once ``problems`` has found it in ``numbers`` (the series)."""
    return _NAMED.sub(lambda match: match.group(1) if match.group(1) in numbers else numbers[match.group(1)], text)


def load(repo=REPO):
    """The facts with the series' current numbers; ValueError listing every problem found."""
    names = [patch_name(patch.name) for patch in read_series(repo)]
    with open(Path(repo) / FACTS_FILE, "rb") as f:
        raw = tomllib.load(f)
    found = problems(raw, names)
    if found:
        raise ValueError("\n".join(found))
    numbers = {patch_name(patch.name): patch.name[:4] for patch in read_series(repo)}
    patches = {}
    for name, facts in raw["patches"].items():
        patches[numbers[name]] = {
            key: render(value, numbers) if isinstance(value, str) else value
            for key, value in facts.items()
        }
    tests = tuple(
        UpstreamTest(test["unit"], test.get("keyword", ""), test["tier"],
                     tuple(numbers[name] for name in test["patches"]), render(test.get("what", ""), numbers))
        for test in raw.get("upstream_tests", []))
    explained = tuple(
        Explained(entry["test"], entry["fork"], entry["pristine"], tuple(
            numbers[name] for name in entry["patches"]), render(entry["why"], numbers))
        for entry in raw.get("explained", []))
    return Facts(numbers, patches, tests, explained)
