# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""pytest's JUnit XML, read once: each test case with one outcome word (passed, failed, error, skipped) and its time."""

import xml.etree.ElementTree as ET
from dataclasses import dataclass

OUTCOMES = ("passed", "failed", "error", "skipped")


@dataclass(frozen=True)
class Case:
    classname: str
    name: str
    outcome: str  # one of OUTCOMES: a failure or an error outranks a skip
    message: str  # the failure's, error's or skip's message ("" when it passed)
    seconds: float = 0.0  # pytest's time for the case: setup, call and teardown (a module fixture's in its first case)

    @property
    def module(self):
        """``tests/test_x.py`` for a classname ``tests.test_x`` or ``tests.test_x.TestClass``."""
        return self._module_and_classes()[0]

    @property
    def test_id(self):
        """pytest's node id: ``tests/test_x.py::test_y[p]`` or ``tests/test_x.py::TestClass::test_y[p]``."""
        module, classes = self._module_and_classes()
        return "::".join([module, *classes, self.name])

    def _module_and_classes(self):
        parts = self.classname.split(".")
        for end, part in enumerate(parts, start=1):
            if part.startswith("test_"):
                return "/".join(parts[:end]) + ".py", parts[end:]
        return self.classname, []


def cases(path):
    """Every test case of a JUnit XML file, in file order."""
    found = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = ("failed" if child.tag == "failure" else "error"), child.get("message") or ""
            elif child.tag == "skipped" and outcome == "passed":
                outcome, message = "skipped", child.get("message") or ""
        found.append(Case(case.get("classname", ""), case.get("name"), outcome, message, float(case.get("time") or 0)))
    return found
