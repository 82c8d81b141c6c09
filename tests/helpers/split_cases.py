# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""The split cases of the norm workers: a test's ``case`` is ``(ranks, *labels, micro, gas)`` and the worker's case
name ``<labels joined by _>_m<micro>_g<gas>``. One launch per rank count serves every selected test of a module
(``launch.LaunchesByRanks``, its cases those pytest selected: ``selection.cases_by_ranks``)."""

from toolkit.launch import LaunchesByRanks
from helpers.selection import cases_by_ranks


def case_name(*labels_micro_gas):
    *labels, micro, gas = labels_micro_gas
    return "_".join([*labels, f"m{micro}", f"g{gas}"])


def case_id(case):
    """A test's id: its case name (the rank count is the module's)."""
    return case_name(*case[1:])


def launches(worker, request, extensions_dir, fixture="launched"):
    """For a module-scoped ``fixture``: the launches of ``worker``, one per rank count, each the first time a test
    reads ``results`` of a case."""
    return LaunchesByRanks(worker, cases_by_ranks(request, fixture, case_name), extensions_dir)


def results(launched, case):
    """Every rank's results of ``case`` (a list, rank 0 first)."""
    return launched[case[0]].case(case_name(*case[1:]))
