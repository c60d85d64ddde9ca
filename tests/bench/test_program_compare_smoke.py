"""A short run of bench/program_compare.py: both programs load, decide, and are compared.

Structure only, never speed: the figures belong to the bench on a quiet machine.
"""

import pathlib
import re
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "program_compare.py"

pytestmark = pytest.mark.dataplane


def test_program_compare_prints_both_programs_at_both_weights():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--rounds", "1", "--repeat", "2000"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = re.findall(r"^\| (100|0) % \| (\d+) \| (\d+) \| ([0-9.]+) \|$", done.stdout, re.M)
    assert [row[0] for row in rows] == ["100", "0"], done.stdout
    for _weight, layout_1, layout_2, ratio in rows:
        assert int(layout_1) > 0 and int(layout_2) > 0
        assert abs(float(ratio) - int(layout_2) / int(layout_1)) < 0.001
    assert "layout 1 (previous release)" in done.stdout
