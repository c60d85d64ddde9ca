"""scripts/test_times.py: pytest's JUnit XML summed per worker group and per test file."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "test_times.py"


def load_script():
    spec = importlib.util.spec_from_file_location("test_times_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPORT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.playbooks.test_drill" name="test_drill@sandbox-fleet" time="100.5"/>
<testcase classname="tests.playbooks.test_chaos" name="test_a@sandbox-fleet" time="20.0"/>
<testcase classname="tests.playbooks.test_chaos" name="test_b@sandbox-fleet" time="30.0"/>
<testcase classname="tests.unit.test_gates" name="test_c[1]" time="0.25"/>
<testcase classname="tests.unit.test_gates.TestWindow" name="test_d" time="0.5"/>
</testsuite></testsuites>
"""


def test_each_group_and_file_gets_its_total_and_count(tmp_path, capsys):
    times = load_script()
    report = tmp_path / "pytest.xml"
    report.write_text(REPORT)
    assert times.main([str(report)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["(no", "group:", "the", "other", "worker)", "0m01s", "2", "tests"]
    assert lines[1].split() == ["tests/unit/test_gates.py", "0m01s", "2", "tests"]
    assert lines[2].split() == ["sandbox-fleet", "2m30s", "3", "tests"]
    # The slowest file of the group first.
    assert lines[3].split() == ["tests/playbooks/test_drill.py", "1m40s", "1", "tests"]
    assert lines[4].split() == ["tests/playbooks/test_chaos.py", "0m50s", "2", "tests"]


def test_a_missing_report_says_so_and_fails(tmp_path, capsys):
    times = load_script()
    assert times.main([str(tmp_path / "absent.xml")]) == 1
    assert "no readable JUnit XML" in capsys.readouterr().out
