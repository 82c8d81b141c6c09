# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""Which parametrized tests of a module this run will run, so that a launch serves exactly those.

One launch runs the cases of many tests (start-up costs 15-40 s here). Deriving its cases from the
tests pytest selected (``-k``, ``-m``, node ids, ``--run-slow``) means a selection narrows the launch too:
a case that hangs on pristine DeepSpeed is left out of the launch with ``-k "not ..."``, not only out of
the report.
"""


def _skipped(item):
    if item.get_closest_marker("skip"):
        return True
    return any(mark.args and mark.args[0] is True for mark in item.iter_markers("skipif"))


def selected_items(request, fixture):
    """The tests of the requesting test module that use ``fixture`` and that this run will run (selected, and
    not skipped by a marker), in collection order."""
    return [
        item for item in request.session.items
        if item.module is request.module and fixture in item.fixturenames and not _skipped(item)
    ]


def params_of(item):
    """A test's parameters (name -> value); empty for a test without any."""
    return getattr(getattr(item, "callspec", None), "params", {})


def selected_callspecs(request, fixture):
    """The parameters (name -> value) of each test in the requesting test module that uses ``fixture`` and
    that this run will run (selected, and not skipped by a marker), in collection order."""
    return [params_of(item) for item in selected_items(request, fixture)]


def selected_params(request, argname, fixture):
    """The values of parameter ``argname`` of the tests in the requesting test module that use ``fixture``
    and that this run will run (selected, and not skipped by a marker), first appearance first, without
    repeats."""
    values = {}
    for params in selected_callspecs(request, fixture):
        if argname in params:
            values.setdefault(params[argname], None)
    return list(values)


def cases_by_ranks(request, fixture, case_name):
    """For ``launch.LaunchesByRanks``: rank count -> the case names of the selected tests using ``fixture``
    whose parameter ``case`` is ``(ranks, *what case_name takes)``."""
    selected = selected_params(request, "case", fixture)
    return lambda ranks: [case_name(*case[1:]) for case in selected if case[0] == ranks]
