# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""pytest plugin loaded into each upstream-suite pytest process (``-p upstream_suite.pytest_plugin``).

It appends one JSON line per event to the file named by ``UPSTREAM_SUITE_EVENTS`` as soon as it
happens, so the runner sees progress live: which test is running (to kill it after a timeout), and
every finished test's outcome even when the process is killed or crashes later.

Events: ``collected`` (all test ids), ``collect_error`` (a file or class that failed to import),
``start`` (a test began), ``result`` (a test ended: outcome and the first line of its reason).

It also gives each DistributedTest a master port the OS picks (``free_master_port``).
"""

import json
import os
import re
import socket
import sys
import time

EVENTS_VAR = "UPSTREAM_SUITE_EVENTS"

_reports = {}


def _emit(event):
    path = os.environ.get(EVENTS_VAR)
    if not path:
        return
    with open(path, "a") as out:
        out.write(json.dumps(event) + "\n")
        out.flush()
        os.fsync(out.fileno())


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(\S[^\n]*)')


def _where(text):
    """'file.py:72: <source line>' of the innermost frame of the last traceback in ``text``."""
    frames = _FRAME.findall(text)
    if not frames:
        return ""
    path, line, source = frames[-1]
    return f"{os.path.basename(path)}:{line}: {source.strip()}"


def first_line(report):
    """The first meaningful line of why a phase failed or skipped.

    A bare exception name ("AssertionError", as DistributedTest re-raises a rank's failed assert) gets
    the innermost frame of the rank's traceback added: the line that failed.
    """
    longrepr = report.longrepr
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # skip: (file, line, message)
        text = str(longrepr[2])
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = crash.message if crash is not None else str(longrepr)
        raised = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
        if crash is None and raised:  # a collection error: its last "E" line names the exception
            return raised[-1][:300]
        if re.fullmatch(r"[\w.]+", text.strip()):
            where = _where(str(longrepr))
            if where:
                text = f"{text.strip()} at {where}"
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def outcome_of(reports):
    """One outcome for a test from its setup/call/teardown reports, and its reason."""
    by_phase = {report.when: report for report in reports}
    setup, call, teardown = by_phase.get("setup"), by_phase.get("call"), by_phase.get("teardown")
    if setup is not None and setup.failed:
        return "error", first_line(setup)
    if setup is not None and setup.skipped:
        if hasattr(setup, "wasxfail"):
            return "xfailed", setup.wasxfail or first_line(setup)
        return "skipped", first_line(setup)
    if call is None:
        return "error", "no call phase was reported"
    if call.skipped:
        if hasattr(call, "wasxfail"):
            return "xfailed", call.wasxfail or "xfail"
        return "skipped", first_line(call)
    if call.failed:
        return "failed", first_line(call)
    if teardown is not None and teardown.failed:
        return "error", "teardown: " + first_line(teardown)
    if hasattr(call, "wasxfail"):
        return "xpassed", call.wasxfail or "xpass"
    return "passed", ""


def free_master_port(base_port=29500, port_range_size=1000):
    """A free port, chosen by the OS, for ``unit.common.get_master_port``. Upstream's takes the first free port
    from 29500, the same one in every pytest process, and a port stays free until the test's rank 0 binds it,
    seconds after: two processes starting a DistributedTest at once (two tiers on one machine, the fork and
    pristine sides in two runners) take the same port, and one test's ranks can meet the other's store (a
    test beside another run hung until upstream's timeout: ``Test hanged, exiting``). Its arguments are
    upstream's, unused."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return str(sock.getsockname()[1])


def use_free_master_ports():
    """Put ``free_master_port`` in place of upstream's ``get_master_port`` in ``unit.common`` and in every
    module that imported it by name (``from unit.common import get_master_port``: AutoEP's CPU/Gloo tests,
    whose file-store rendezvous leaves the port unbound, so both sides' copies of a test running at once
    took 29500 alike, and the CPU comm op, which names its /dev/shm buffers after the port, gave them the
    same buffers: the fork's ranks aborted, ``CPU/Gloo worker failures: -6``)."""
    common = sys.modules.get("unit.common")  # imported by the collected test files that use DistributedTest
    upstream = getattr(common, "get_master_port", None)
    if upstream is None:
        return
    for module in list(sys.modules.values()):
        if getattr(module, "get_master_port", None) is upstream:
            module.get_master_port = free_master_port


def pytest_collection_finish(session):
    use_free_master_ports()
    _emit({"event": "collected", "ids": [item.nodeid for item in session.items]})


def pytest_collectreport(report):
    if report.failed:
        _emit({"event": "collect_error", "id": report.nodeid, "reason": first_line(report)})


def pytest_runtest_logstart(nodeid, location):
    _reports[nodeid] = []
    _emit({"event": "start", "id": nodeid, "time": time.time()})


def pytest_runtest_logreport(report):
    _reports.setdefault(report.nodeid, []).append(report)


def pytest_runtest_logfinish(nodeid, location):
    reports = _reports.pop(nodeid, [])
    outcome, reason = outcome_of(reports)
    duration = sum(getattr(report, "duration", 0.0) for report in reports)
    _emit({"event": "result", "id": nodeid, "outcome": outcome, "reason": reason, "duration": round(duration, 2)})
