"""Where a unit test lies: tests/unit mirrors the checkout (README.md, "Where tests
lie").

A plugin's test lies at tests/unit/<the plugin's folder>/test_<name>.py (plugins/modules/,
plugins/module_utils/common/, ...), a role's at tests/unit/roles/<role>/, and a test of
another part of the checkout (playbooks/tasks/, scripts/) in the same way. So every folder
under tests/unit but helpers/ is a folder of the checkout. The shared helpers are in
tests/unit/helpers/, which holds no test. This file is the one test directly in tests/unit:
its subject is tests/unit itself. Every folder has an __init__.py (tests/unit/conftest.py
says why).
"""

from pathlib import Path

UNIT = Path(__file__).resolve().parent
REPO = UNIT.parents[1]
HELPERS = "helpers"
THIS_FILE = "test_layout.py"
# Python files that may lie in any folder, beside the tests.
ANYWHERE = {"__init__.py", "conftest.py"}


def layout_problems(unit, repo):
    """What in the tree at unit (tests/unit) breaks the layout, one line each."""
    problems = []
    folders = sorted(
        path for path in unit.rglob("*") if path.is_dir() and "__pycache__" not in path.parts
    )
    for folder in [unit, *folders]:
        where = folder.relative_to(unit)
        if not (folder / "__init__.py").is_file():
            problems.append("%s: no __init__.py" % (folder.relative_to(repo)))
        if where.parts and where.parts[0] == HELPERS:
            continue
        if where.parts and not (repo / where).is_dir():
            problems.append(
                "%s: %s is no folder of the checkout" % (folder.relative_to(repo), where)
            )
    for path in sorted(unit.rglob("*.py")):
        if "__pycache__" in path.parts or path.name in ANYWHERE:
            continue
        where = path.relative_to(unit)
        in_helpers = where.parts[0] == HELPERS
        if path.name.startswith("test_"):
            if in_helpers:
                problems.append("%s: a test among the helpers" % path.relative_to(repo))
            elif len(where.parts) == 1 and path.name != THIS_FILE:
                problems.append(
                    "%s: directly in tests/unit, not beside what it tests" % path.relative_to(repo)
                )
        elif not in_helpers:
            problems.append("%s: a helper outside tests/unit/helpers" % path.relative_to(repo))
    return problems


def test_every_unit_test_lies_where_its_subject_lies():
    problems = layout_problems(UNIT, REPO)
    assert not problems, "\n".join(problems)


def test_a_test_out_of_place_is_reported(tmp_path):
    repo = tmp_path
    (repo / "plugins" / "modules").mkdir(parents=True)
    (repo / "roles" / "web").mkdir(parents=True)
    unit = repo / "tests" / "unit"
    for folder in ("", "helpers", "plugins", "plugins/modules", "roles", "roles/web"):
        (unit / folder).mkdir(parents=True, exist_ok=True)
        (unit / folder / "__init__.py").touch()
    for path in (THIS_FILE, "conftest.py", "helpers/steps.py", "plugins/modules/test_route.py"):
        (unit / path).touch()
    (unit / "roles" / "web" / "test_web.py").touch()
    assert layout_problems(unit, repo) == []

    (unit / "test_stray.py").touch()
    (unit / "helpers" / "test_helper.py").touch()
    (unit / "plugins" / "modules" / "steps.py").touch()
    (unit / "roles" / "db").mkdir()
    (unit / "roles" / "db" / "__init__.py").touch()
    (unit / "roles" / "db" / "test_db.py").touch()
    (unit / "plugins" / "filters").mkdir()
    (unit / "plugins" / "filters" / "test_split.py").touch()
    assert layout_problems(unit, repo) == [
        "tests/unit/plugins/filters: no __init__.py",
        "tests/unit/plugins/filters: plugins/filters is no folder of the checkout",
        "tests/unit/roles/db: roles/db is no folder of the checkout",
        "tests/unit/helpers/test_helper.py: a test among the helpers",
        "tests/unit/plugins/modules/steps.py: a helper outside tests/unit/helpers",
        "tests/unit/test_stray.py: directly in tests/unit, not beside what it tests",
    ]
