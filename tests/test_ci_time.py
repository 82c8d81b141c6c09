# SPDX-License-Identifier: Apache-2.0

# DeepSpeed Team
"""tools/ci-time: seconds per test module from a run's JUnit XML, costliest first."""

import ci_time
from toolkit import junit

XML = """<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_first[x]" time="30.5"/>
<testcase classname="tests.test_a" name="test_second" time="1.5"><skipped message="slow"/></testcase>
<testcase classname="tests.test_b.TestGroup" name="test_c" time="40.0"><failure message="no"/></testcase>
<testcase classname="tests.test_c" name="test_d"/>
</testsuite></testsuites>"""


def test_modules_costliest_first_with_their_tests_run_and_skipped(tmp_path):
    xml = tmp_path / "ci-junit.xml"
    xml.write_text(XML)
    assert [case.seconds for case in junit.cases(xml)] == [30.5, 1.5, 40.0, 0.0]
    assert ci_time.per_module(junit.cases(xml)) == [("tests/test_b.py", 40.0, 1, 0), ("tests/test_a.py", 32.0, 1, 1),
                                                    ("tests/test_c.py", 0.0, 1, 0)]


def test_cases_name_their_module_and_pytest_id(tmp_path):
    xml = tmp_path / "ci-junit.xml"
    xml.write_text(XML)
    assert [(case.module, case.test_id)
            for case in junit.cases(xml)] == [("tests/test_a.py", "tests/test_a.py::test_first[x]"),
                                              ("tests/test_a.py", "tests/test_a.py::test_second"),
                                              ("tests/test_b.py", "tests/test_b.py::TestGroup::test_c"),
                                              ("tests/test_c.py", "tests/test_c.py::test_d")]


def test_table_and_total(tmp_path, capsys):
    xml = tmp_path / "ci-junit.xml"
    xml.write_text(XML)
    assert ci_time.main([str(xml), "--most", "1"]) == 0
    out = capsys.readouterr().out
    assert "| tests/test_b.py | 40 | 56% | 1 | 0 |" in out and "test_a" not in out
    assert "3 modules, 72 s in all" in out


def test_a_missing_file_is_named(tmp_path, capsys):
    assert ci_time.main([str(tmp_path / "absent.xml")]) == 2
    assert "absent.xml" in capsys.readouterr().err
