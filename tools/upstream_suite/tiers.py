# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The named selections of upstream's tests (docs/develop/upstream_suite.md explains each).

- ``patch``: the upstream test files that exercise what each patch of patches/series touches; run by
  the test suite (CI) on the fork against a recorded pristine baseline.
- ``full``: every unit-test directory that can run on a CPU; hours on 2 cores, resumable.
- ``gpu``: fp16 (half_precision/), the hybrid engine's inference layers (hybrid_engine/) and the CUDA-only tests of
  the patch tier, for a GPU machine.
"""

from dataclasses import dataclass
from pathlib import Path

from patch_facts import load as load_facts
from upstream_suite.execute import Unit
from toolkit import tables


@dataclass(frozen=True)
class Covered:
    unit: Unit
    patches: tuple  # the current numbers of the patches whose changed code the unit runs
    what: str  # what of those patches it exercises


def _covered(test):
    return Covered(Unit(test.path, test.keyword), test.patches, test.what)


# Which upstream test files run which patch's code is a fact about each patch: patches/facts.toml holds it, by
# patch name. The fork side of the patch tier runs in CI beside our own suite (CI's budget: 30 minutes in all), so
# files with many slow distributed cases are narrowed with -k to the cases that run the patched code; the full tier
# runs every case of every file. FULL_TIER_COVERAGE: files that reach patched code but stay out of the CI tier, and
# why; UNCOVERED: patches whose changed lines no upstream test runs on a CPU, and why.
_FACTS = load_facts()
PATCH_TIER = tuple(_covered(test) for test in _FACTS.tier("patch"))
FULL_TIER_COVERAGE = tuple(_covered(test) for test in _FACTS.tier("full"))
UNCOVERED = _FACTS.uncovered()

# Directories left out of the full tier: they need CUDA kernels (they skip or fail to import on a CPU).
GPU_ONLY_DIRS = (
    "unit/inference",
    "unit/hybrid_engine",
    "unit/ops/transformer",
    "unit/ops/sparse_attention",
    "unit/ops/spatial",
    "unit/ops/quantizer",
    "unit/ops/fp_quantizer",
    "unit/ops/deepspeed4science",
    "unit/v1/ops",
    "unit/v1/nvme",
    "unit/module_inject",
)

# fp16, and the hybrid engine's inference layers (the engine-surface map's GPU-only hybrid_engine settings).
GPU_TIER_DIRS = ("unit/runtime/half_precision", "unit/v1/half_precision", "unit/hybrid_engine")


def test_files(tests_dir, under="unit"):
    """Every test_*.py below ``under``, as paths relative to ``tests_dir``, sorted."""
    root = Path(tests_dir)
    return sorted(str(path.relative_to(root)) for path in (root / under).rglob("test_*.py"))


def _is_under(path, directories):
    return any(path == directory or path.startswith(directory + "/") for directory in directories)


def units(tier, tests_dir):
    """The units of a named tier, in run order."""
    if tier == "patch":
        return [covered.unit for covered in PATCH_TIER]
    if tier == "full":
        return [Unit(path) for path in test_files(tests_dir) if not _is_under(path, GPU_ONLY_DIRS)]
    if tier == "gpu":
        patch_paths = [covered.unit.path for covered in PATCH_TIER]
        half = [path for path in test_files(tests_dir) if _is_under(path, GPU_TIER_DIRS)]
        return [Unit(path) for path in dict.fromkeys(half + patch_paths)]
    raise ValueError(f"unknown tier {tier!r}: choose patch, full or gpu")


def patch_table():
    """Markdown: each patch, by name in series order -> the upstream test files that cover it
    (docs/evidence/upstream_coverage.md, written by tools/upstream_coverage.py)."""
    by_patch = {}
    for covered in PATCH_TIER + FULL_TIER_COVERAGE:
        for patch in covered.patches:
            by_patch.setdefault(patch, []).append(covered)
    names = {number: name for name, number in _FACTS.numbers.items()}
    lines = [
        *tables.header(["patch", "upstream tests that run its code (CI's patch tier; *full tier only* where marked)"])
    ]
    for patch in sorted(set(by_patch) | set(UNCOVERED)):
        cells = [(f"`{covered.unit.key}` ({covered.what})"
                  if covered in PATCH_TIER else f"*full tier only*: `{covered.unit.path}` ({covered.what})")
                 for covered in by_patch.get(patch, [])]
        if patch in UNCOVERED:
            cells.append(f"**none reaches the changed lines on a CPU**: {UNCOVERED[patch]}")
        lines.append(f"| {names[patch]} | {'; '.join(cells)} |")
    return "\n".join(lines)
