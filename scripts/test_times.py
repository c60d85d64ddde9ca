"""Where pytest's time went, per test file and per worker group, from its JUnit XML.

scripts/test runs pytest on two workers: the sandbox-fleet tests (xdist group
"sandbox-fleet", one worker, the run's critical path) and everything else on the other.
This prints each group's total (setup, call and teardown of every test) and its slowest
files, so a run that grew says where, without a second run.

Usage: .venv/bin/python scripts/test_times.py JUNIT_XML [--top N]
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET

OTHER_GROUP = "(no group: the other worker)"


def group_of(name):
    """The xdist group a test ran in: pytest-xdist's loadgroup appends "@group" to its name."""
    return name.rsplit("@", 1)[1] if "@" in name else OTHER_GROUP


def file_of(classname):
    """tests.playbooks.test_drill (or tests.playbooks.test_drill.TestX) -> the test file."""
    parts = classname.split(".")
    while parts and not parts[-1].startswith("test_"):
        parts.pop()
    return "/".join(parts) + ".py" if parts else classname


def tally(root):
    """{group: {file: (seconds, tests)}} over every testcase of the report."""
    totals = collections.defaultdict(lambda: collections.defaultdict(lambda: [0.0, 0]))
    for case in root.iter("testcase"):
        entry = totals[group_of(case.get("name", ""))][file_of(case.get("classname", ""))]
        entry[0] += float(case.get("time") or 0.0)
        entry[1] += 1
    return totals


def minutes(seconds):
    return "%dm%02ds" % divmod(round(seconds), 60)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("junit_xml")
    parser.add_argument("--top", type=int, default=12, help="files shown per group (default 12)")
    args = parser.parse_args(argv)
    try:
        root = ET.parse(args.junit_xml).getroot()  # noqa: S314 - pytest's own report
    except (OSError, ET.ParseError) as error:
        print("test_times: no readable JUnit XML at %s: %s" % (args.junit_xml, error))
        return 1
    for group, files in sorted(tally(root).items()):
        total = sum(seconds for seconds, _count in files.values())
        count = sum(tests for _seconds, tests in files.values())
        print("%-44s %9s  %5d tests" % (group, minutes(total), count))
        ranked = sorted(files.items(), key=lambda item: -item[1][0])
        for path, (seconds, tests) in ranked[: args.top]:
            print("  %-42s %9s  %5d tests" % (path, minutes(seconds), tests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
