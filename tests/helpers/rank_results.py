# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The checks the norm workers' tests make on every rank's results of one case: the reported grad norm and
the update against the fp64 reference, and the collectives of the step (``results``: one dict per rank, as
``LaunchesByRanks(...)[ranks].case(name)`` returns them). No results at all fail: a check of nothing passes
nothing."""


def tolerance(table, path):
    """The value of ``table`` (dtype -> tolerance, e.g. {"bf16": ..., "fp32": ...}) whose dtype the engine path's name
    holds (the first one in the table's order)."""
    return next(value for key, value in table.items() if key in path)


def each_rank(results):
    """``(rank, result)`` of every rank's results, for a check of each; no results at all fail."""
    results = list(results)
    assert results, "no rank reported results for this case"
    return enumerate(results)


def assert_norm_matches(results, tolerance):
    """Every rank reports a grad norm within ``tolerance`` (relative) of the fp64 reference norm."""
    for rank, result in each_rank(results):
        assert result["norm"] is not None, f"rank {rank}: get_global_grad_norm() is None"
        error = abs(result["norm"] - result["reference_norm"]) / result["reference_norm"]
        assert error <= tolerance, f"rank {rank}: norm off the fp64 reference by {error:.3g} > {tolerance}: {result}"


def assert_update_matches(results, tolerance):
    """Every rank's update is within ``tolerance`` (the worker's relative ``update_error``) of the fp64 one."""
    for rank, result in each_rank(results):
        error = result["update_error"]
        assert error <= tolerance, f"rank {rank}: update off the fp64 reference by {error:.3g} > {tolerance}: {result}"


def assert_collectives(results, expected=1):
    """Every rank's model step took ``expected`` collectives (counted by the worker)."""
    for rank, result in each_rank(results):
        calls = result["collectives_in_boundary_step"]
        assert calls == expected, f"rank {rank}: {calls} collectives in the step, not {expected}: {result}"
