#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The engine's config surface and the coverage map over it.

The surface is read off the installed engine (``deepspeed.gafix.config_surface``), not listed by hand.

The map (``docs/reference/engine_surface.toml``) gives each key a row: how the fork's promise stands on it
(``STATUSES``). ``check()`` fails on a key with no row (a rebase that adds one), on a row no key matches
(a key that went away), and on a row without what its status needs; ``render()`` writes the tables of the map's
pages (``PAGES``: docs/reference/engine_surface.md counts the keys by status, the others hold the rows) and
``shipped()`` the map as the wheel carries it (``deepspeed/gafix/engine_surface.json``, read by ``ds_gas_check
--preflight``).

    tools/engine_surface.py            print what check() finds (exit 1 if anything)
    tools/engine_surface.py --write    rewrite the map's pages and the shipped JSON from the map
    tools/engine_surface.py --keys     print the surface, one key a line
"""

import argparse
import json
import sys
import tomllib

from toolkit import REPO, tables
from deepspeed.gafix.config_surface import (  # noqa: F401 (SECTION_MODELS: the surface the map covers)
    MAP_FILE, SECTION_MODELS, matches, rows_of, surface)

MAP = REPO / "docs" / "reference" / "engine_surface.toml"
PAGE = REPO / "docs" / "reference" / "engine_surface.md"


def _zero(row):
    return row["keys"][0].startswith("zero_optimization")


# The pages that hold the rows, split by what a reader comes with (a key of their config): ZeRO's keys, then the
# other keys checked against fp64, then the rest. page -> which rows it holds.
PAGES = {
    PAGE.with_name("engine_surface_zero.md"): _zero,
    PAGE.with_name("engine_surface_covered.md"): lambda row: not _zero(row) and row["status"] == "covered",
    PAGE.with_name("engine_surface_other.md"): lambda row: not _zero(row) and row["status"] != "covered",
}
# The map as the product reads it (ds_gas_check's pre-flight): JSON, which every Python reads and the wheel ships.
SHIPPED = REPO / "deepspeed" / "gafix" / MAP_FILE.name

# status -> (what it means, what a row of it must name)
STATUSES = {
    "covered": ("fork against fp64 PyTorch at several GAS splits and world sizes", "tests"),
    "refused": ("the engine refuses it with an error naming the key", "note"),
    "approximate": ("approximate by design; the invariance it does promise is tested", "note"),
    "removed": ("0.19.8 itself refuses the key", "note"),
    "gpu-only": ("runs on a GPU only; checked by tools/gpu-check", "note"),
    "open": ("on the gradient path, not yet checked against fp64", "note"),
    "off-path": ("does not touch gradient accumulation, reduction, scaling, overflow or clipping", "note"),
}


def load_map(path=MAP):
    with open(path, "rb") as f:
        return tomllib.load(f)["row"]


def problems(keys, rows, unmapped=(), repo=REPO):
    """Everything wrong with ``rows`` as a map of ``keys``: one line each."""
    found = []
    for key in keys:
        holding = rows_of(key, rows)
        if not holding:
            found.append(f"{key}: no row in {MAP.relative_to(REPO)} (what does the fork promise on it?)")
        elif len({row["status"] for row in holding}) > 1:
            found.append(f"{key}: rows of different statuses: {sorted({row['status'] for row in holding})}")
    for row in rows:
        for pattern in row["keys"]:
            if not any(matches(pattern, key) for key in keys):
                found.append(f"{pattern}: a row, but the engine reads no such key")
        status = row.get("status")
        if status not in STATUSES:
            found.append(f"{row['keys']}: status {status!r} is none of {sorted(STATUSES)}")
            continue
        needs = STATUSES[status][1]
        if not row.get(needs):
            found.append(f"{row['keys']}: a {status!r} row needs its {needs!r}")
        for test in row.get("tests", []):
            if not (repo / test.split("::")[0]).is_file():
                found.append(f"{row['keys']}: test {test} does not exist")
    for model in unmapped:
        found.append(
            f"{model}: a config model no section of SECTION_MODELS reaches (deepspeed/gafix/config_surface.py)")
    return found


def status_counts(rows, keys):
    """``{status: how many of the engine's keys have it}``."""
    status_of_keys = [holding[0]["status"] for holding in (rows_of(key, rows) for key in keys) if holding]
    return {status: status_of_keys.count(status) for status in STATUSES if status in status_of_keys}


def render(rows, keys):
    """The markdown tables of ``rows``, by status, each headed by how many of the engine's ``keys`` they hold."""
    counts = status_counts(rows, keys)
    lines = []
    for status, (meaning, _) in STATUSES.items():
        of_status = [row for row in rows if row["status"] == status]
        if not of_status:
            continue
        lines += [
            f"### {status} ({counts.get(status, 0)} keys)", "", meaning + ".", "",
            *tables.header(["keys", "what", "tests"])
        ]
        for row in of_status:
            names = ", ".join(f"`{k}`" for k in row["keys"])
            tests = ", ".join(f"`{t}`" for t in row.get("tests", []))
            lines.append(f"| {names} | {row.get('note', '')} | {tests} |")
        lines.append("")
    return "\n".join(lines)


def render_summary(rows, keys):
    """The main page's table: each status, how many keys have it, and what it means."""
    counts = status_counts(rows, keys)
    lines = [*tables.header(["status", "keys", "meaning"], right={"keys"})]
    lines += [
        f"| {status} | {counts[status]} | {meaning} |" for status, (meaning, _) in STATUSES.items() if status in counts
    ]
    return "\n".join(lines) + "\n"


def rendered_pages(rows, keys):
    """``{page: its generated part}``: the summary on the main page, the rows on the others."""
    pages = {PAGE: render_summary(rows, keys)}
    for page, holds in PAGES.items():
        held = [row for row in rows if holds(row)]
        pages[page] = render(held, [key for key in keys if rows_of(key, held)])
    return pages


def shipped(rows):
    """The map as deepspeed/gafix/engine_surface.json holds it."""
    return json.dumps({"source": MAP.relative_to(REPO).as_posix(), "rows": rows}, indent=1) + "\n"


BEGIN, END = "<!-- engine-surface: begin -->", "<!-- engine-surface: end -->"


def page_with(generated, page_text):
    """``page_text`` with its generated part replaced by ``generated``."""
    head, rest = page_text.split(BEGIN, 1)
    return head + BEGIN + "\n" + generated + END + rest.split(END, 1)[1]


def stale_pages(rows, keys):
    """The map's pages whose generated part is not what the map renders."""
    return [
        page for page, generated in rendered_pages(rows, keys).items()
        if page.read_text() != page_with(generated, page.read_text())
    ]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the page's tables from the map")
    parser.add_argument("--keys", action="store_true", help="print the engine's config surface")
    args = parser.parse_args(argv)
    keys, unmapped = surface()
    if args.keys:
        print("\n".join(keys))
        return 0
    rows = load_map()
    if args.write:
        for page, generated in rendered_pages(rows, keys).items():
            page.write_text(page_with(generated, page.read_text()))
        SHIPPED.write_text(shipped(rows))
        return 0
    found = problems(keys, rows, unmapped)
    found += [
        f"{page.relative_to(REPO)} is not what the map renders: tools/engine_surface.py --write"
        for page in stale_pages(rows, keys)
    ]
    if not SHIPPED.is_file() or SHIPPED.read_text() != shipped(rows):
        found.append(f"{SHIPPED.relative_to(REPO)} is not the map: tools/engine_surface.py --write")
    print("\n".join(found) or f"{len(keys)} keys, every one with a row")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
