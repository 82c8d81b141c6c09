# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Markdown tables, the form every report of the tools and benchmarks writes its results in."""


def row(cells):
    """One table row; a ``|`` inside a cell is escaped, so a cell cannot split the row."""
    return "| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |"


def header(columns, right=()):
    """A table's two header lines; the columns named in ``right`` (numbers) are right-aligned."""
    return [row(columns), "|" + "".join("---:|" if column in right else "---|" for column in columns)]


def table(columns, rows, right=()):
    """The lines of a whole table."""
    return header(columns, right) + [row(cells) for cells in rows]
