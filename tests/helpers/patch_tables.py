# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The patch tables of docs/reference (one row per patch of the series, by name), as the tests read them."""

import re

from helpers.repo import REPO

PATCH_TABLES = ("patches_training.md", "patches_checkpoints.md", "patches_launcher_and_builds.md")


def patch_rows():
    """``{patch name: its row's cells after the name}`` of the patch tables (docs/reference/patches_*.md), and the
    names in each table's order."""
    rows, orders = {}, []
    for page in PATCH_TABLES:
        found = re.findall(r"^\| `([^`]+)` \| (.*) \|$", (REPO / "docs" / "reference" / page).read_text(), flags=re.M)
        orders.append([name for name, _ in found])
        rows.update({name: [cell.strip() for cell in rest.split(" | ")] for name, rest in found})
    return rows, orders
