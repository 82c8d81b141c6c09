# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""How ds_gas_check's per-split results read in a failed assertion."""


def describe(rows):
    return "\n".join(f"{r['name']}: norm error {r['norm_error']:.2e}, update errors {r['update_errors']}, "
                     f"{r['diagnosis']}" for r in rows)


def assert_single_rank_splits_pass(rows):
    """One rank's results: the four default splits, each within tolerance of the fp64 reference."""
    assert [r["name"] for r in rows] == ["16 x 1 x 1", "8 x 2 x 1", "4 x 4 x 1", "2 x 8 x 1"]
    assert all(r["passed"] for r in rows), describe(rows)
