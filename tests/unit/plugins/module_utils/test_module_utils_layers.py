"""The layers of plugins/module_utils and what each may import, read from the sources (ast).

A layer is a package of module_utils (common/, store/, ...). A module in a layer imports the
standard library, its own layer and what MAY_IMPORT allows it, nothing else: no module of
another layer, no module still at the top of module_utils, nothing installed (the nodes
run module_utils with Python alone). The files at the top belong to no layer yet and are
not held to a rule, except that a helper that moved (into a layer, or down to a module
that both its users import) is used from there only (MOVED): not imported from the module
it left, nor read as an attribute of it.
"""

import ast
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[4]
MODULE_UTILS = REPO / "plugins" / "module_utils"
PACKAGE = "ansible_collections.zerolayer.fleet.plugins.module_utils"

# layer -> what its modules may import besides the standard library and their own layer:
# other layers by name, or "ansible" (ansible.module_utils, which Ansible ships with a
# module; never on a node).
MAY_IMPORT = {
    "common": (),
    "store": ("common",),
    # A weight write checks the store's fence epoch where the node has a store: the data
    # plane reads the store, never the rollout, the controller or the reports.
    "dataplane": ("common", "store"),
    # The node's commands: zerolayer-routectl, its fence watcher, the route exporter. A node
    # runs them from the node artifact, so they never import the rollout: what a node knows
    # of a rollout is its copy of the record, read with common's codec.
    "node": ("common", "store", "dataplane"),
    # What a rollout decides: its record, steps, gates, guard and fence. It writes weights
    # through the data plane's codec and never imports a node's command.
    "rollout": ("common", "store", "dataplane"),
    # What is measured and exported: Prometheus's API (through ansible-core's open_url, on the
    # controller) and the store's exporter, which shares the node exporter's rendering and
    # reads the rollout's records.
    "telemetry": ("common", "store", "dataplane", "node", "rollout", "ansible"),
    # What people read: the drill's report, the rollout's timeline, the notifications.
    "reports": ("common", "store", "rollout", "telemetry"),
    # The operator's commands (zerolayer, its rollback): the top, which may use any layer,
    # and ansible-core's inventory for the nodes a rollback names.
    "controller": (
        "common",
        "store",
        "dataplane",
        "node",
        "rollout",
        "telemetry",
        "reports",
        "ansible",
    ),
}
# Installed packages a layer may import, by their top-level name: each only on the
# controller, imported where it is needed, with a remedy when it is missing.
MAY_IMPORT_INSTALLED = {
    # The drill's plot.
    "reports": ("matplotlib",),
    # A sink file in YAML (PyYAML comes with ansible-core).
    "controller": ("yaml",),
}
# Helpers (functions, classes) that moved, by the module they left: used from their new home
# only.
MOVED = {
    "rollout.gates": {
        "common.clock": ("utc_now", "format_timestamp", "parse_timestamp", "seconds_between"),
        "common.numbers": ("parse_number",),
    },
    "rollout.rollout": {
        "common.clock": ("parse_duration",),
        # The record's file format, which a node reads without importing the rollout.
        "common.record_codec": (
            "validate_rollout_id",
            "encode_record",
            "decode_record",
            "read_json_file",
            "read_record",
            "write_json_atomic",
            "write_record",
        ),
    },
    # What a stage's cohort is and how people read it: the events need it too.
    "rollout.stage_table": {
        "common.cohorts": ("stage_cohort", "schedule_cohort", "format_prefixes", "format_cohort"),
    },
    # The watcher's refusals and the weight writers' are one class, the fence's.
    "node.fence_watcher": {
        "dataplane.fence": ("FenceRefused",),
        # The node's way to the store, which the data plane's epoch check takes too.
        "store.node_client": ("node_store",),
    },
}
MOVED_FROM_GATES = MOVED["rollout.gates"]


def layer_dirs():
    return sorted(path for path in MODULE_UTILS.iterdir() if (path / "__init__.py").exists())


def layer_modules():
    return sorted(path for layer in layer_dirs() for path in layer.rglob("*.py"))


def imported_modules(source):
    """(line, module name, level) of every import in source, function-local ones too.
    `from PACKAGE import a, b` imports the modules a and b of module_utils."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found.extend((node.lineno, PACKAGE + "." + alias.name, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level))
    return sorted(found)


def kind_of(module, level, layers):
    """What an imported module is: "stdlib", a layer's name, "top" (a module at the top of
    module_utils, in no layer yet), "ansible", "relative" or "other" (installed)."""
    if level:
        # The node artifact follows absolute imports only.
        return "relative"
    if module == PACKAGE:
        return "top"
    if module.startswith(PACKAGE + "."):
        first = module[len(PACKAGE) + 1 :].split(".")[0]
        return first if first in layers else "top"
    top = module.split(".")[0]
    if top in sys.stdlib_module_names:
        return "stdlib"
    return "ansible" if top in ("ansible", "ansible_collections") else "other"


def import_violations(source, layer, layers=None):
    """["line N: imports M (kind)", ...] for each import of source that a module of `layer`
    may not make under `layers` (MAY_IMPORT unless given)."""
    layers = MAY_IMPORT if layers is None else layers
    allowed = {"stdlib", layer, *layers[layer]}
    violations = []
    installed = MAY_IMPORT_INSTALLED.get(layer, ())
    for line, module, level in imported_modules(source):
        kind = kind_of(module, level, layers)
        if kind == "other" and module.split(".")[0] in installed:
            continue
        if kind not in allowed:
            violations.append("line %d: imports %s%s (%s)" % (line, "." * level, module, kind))
    return violations


def moved_helper_uses(source, moved_table=None):
    """["line N: NAME from OLD (now in HOME)", "line N: OLD.NAME (now in HOME)", ...]: each
    import of a moved helper from the module it left, and each read of it as an attribute of
    that module (`from PACKAGE.LAYER import OLD [as x]` or `import PACKAGE.LAYER.OLD as x`, then
    x.NAME),
    under moved_table (MOVED unless given)."""
    moved_table = MOVED if moved_table is None else moved_table
    moved = {
        (old, name): home
        for old, homes in moved_table.items()
        for home, names in homes.items()
        for name in names
    }
    tree = ast.parse(source)
    bound = {}  # a name this source gives a module that helpers left -> that module
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (
            node.module == PACKAGE or (node.module or "").startswith(PACKAGE + ".")
        ):
            # `from PACKAGE.rollout import gates` imports the module "rollout.gates".
            where = node.module[len(PACKAGE) + 1 :]
            for alias in node.names:
                old = "%s.%s" % (where, alias.name) if where else alias.name
                if old in moved_table:
                    bound[alias.asname or alias.name] = old
        elif isinstance(node, ast.Import):
            for alias in node.names:
                old = alias.name[len(PACKAGE) + 1 :] if alias.name.startswith(PACKAGE + ".") else ""
                if alias.asname and old in moved_table:
                    bound[alias.asname] = old
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            old = node.module[len(PACKAGE) + 1 :]
            for alias in node.names:
                if (old, alias.name) in moved:
                    found.append(
                        (
                            node.lineno,
                            "%s from %s (now in %s)" % (alias.name, old, moved[(old, alias.name)]),
                        )
                    )
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (bound.get(node.value.id), node.attr) in moved
        ):
            old = bound[node.value.id]
            found.append(
                (node.lineno, "%s.%s (now in %s)" % (old, node.attr, moved[(old, node.attr)]))
            )
    # By line; on one line, in the order of the source's names.
    return ["line %d: %s" % entry for entry in sorted(found, key=lambda entry: entry[0])]


def test_every_layer_has_a_rule_and_every_rule_a_layer():
    assert [path.name for path in layer_dirs()] == sorted(MAY_IMPORT)
    for allowed in MAY_IMPORT.values():
        assert set(allowed) <= set(MAY_IMPORT) | {"ansible"}


def test_no_layer_is_a_folder_without_its_init_file():
    """A folder of module_utils without __init__.py would be a layer nobody checks (and the
    node artifact would not find its modules)."""
    folders = [p for p in MODULE_UTILS.iterdir() if p.is_dir() and p.name != "__pycache__"]
    assert [p.name for p in folders if not (p / "__init__.py").exists()] == []


@pytest.mark.parametrize(
    "path", layer_modules(), ids=lambda path: str(path.relative_to(MODULE_UTILS))
)
def test_a_layer_imports_only_what_its_rule_allows(path):
    layer = path.relative_to(MODULE_UTILS).parts[0]
    assert import_violations(path.read_text(), layer) == []


def test_a_bad_import_is_reported():
    """The check above can fail: each kind of import common may not make is named."""
    source = (
        "from __future__ import annotations\n"
        "import os\n"
        "from %(p)s.common import errors\n"
        "from %(p)s.common.clock import utc_now\n"
        "from %(p)s import rollout\n"
        "from %(p)s.gates import Gate\n"
        "import yaml\n"
        "def later():\n"
        "    from ansible.module_utils.urls import open_url\n"
        "from . import locks\n"
    ) % {"p": PACKAGE}
    assert import_violations(source, "common") == [
        "line 5: imports %s.rollout (rollout)" % PACKAGE,
        "line 6: imports %s.gates (top)" % PACKAGE,
        "line 7: imports yaml (other)",
        "line 9: imports ansible.module_utils.urls (ansible)",
        "line 10: imports . (relative)",
    ]
    # A layer's rule is its line of MAY_IMPORT: what the line lists, the layer may import.
    layers = {**MAY_IMPORT, "telemetry": ("common", "ansible")}
    assert import_violations(source, "telemetry", layers) == [
        "line 5: imports %s.rollout (rollout)" % PACKAGE,
        "line 6: imports %s.gates (top)" % PACKAGE,
        "line 7: imports yaml (other)",
        "line 10: imports . (relative)",
    ]


def test_the_store_may_import_common_and_nothing_above_it():
    source = (
        "from %(p)s.common.errors import FleetError\n"
        "from %(p)s.store import etcd_v3\n"
        "from %(p)s.store.rollout_store import RolloutStore\n"
        "from %(p)s.rollout import rollout\n"
        "from %(p)s.rollout.stage_table import format_weight\n"
    ) % {"p": PACKAGE}
    assert import_violations(source, "store") == [
        "line 4: imports %s.rollout (rollout)" % PACKAGE,
        "line 5: imports %s.rollout.stage_table (rollout)" % PACKAGE,
    ]
    # common, below it, may not import the store.
    assert import_violations(source, "common") == [
        "line 2: imports %s.store (store)" % PACKAGE,
        "line 3: imports %s.store.rollout_store (store)" % PACKAGE,
        "line 4: imports %s.rollout (rollout)" % PACKAGE,
        "line 5: imports %s.rollout.stage_table (rollout)" % PACKAGE,
    ]


def test_a_node_command_may_not_import_the_rollout_the_reports_or_the_controller():
    source = (
        "from %(p)s.dataplane import routes\n"
        "from %(p)s.store.node_client import node_store\n"
        "from %(p)s.common.record_codec import read_record\n"
        "from %(p)s.rollout.rollout import read_record\n"
        "from %(p)s.reports import notify\n"
        "from %(p)s.controller.rollout_cli import main\n"
        "from %(p)s.telemetry import store_exporter\n"
    ) % {"p": PACKAGE}
    assert import_violations(source, "node") == [
        "line 4: imports %s.rollout.rollout (rollout)" % PACKAGE,
        "line 5: imports %s.reports (reports)" % PACKAGE,
        "line 6: imports %s.controller.rollout_cli (controller)" % PACKAGE,
        "line 7: imports %s.telemetry (telemetry)" % PACKAGE,
    ]
    # The controller, at the top, may import every one of them.
    assert import_violations(source, "controller") == []


def test_an_installed_package_is_allowed_only_to_the_layer_that_lists_it():
    source = "import matplotlib.pyplot\nimport yaml\n"
    assert import_violations(source, "reports") == ["line 2: imports yaml (other)"]
    assert import_violations(source, "controller") == ["line 1: imports matplotlib.pyplot (other)"]
    assert import_violations(source, "rollout") == [
        "line 1: imports matplotlib.pyplot (other)",
        "line 2: imports yaml (other)",
    ]


def test_every_module_is_in_a_layer():
    """No module at the top of module_utils: each one is in the layer that says what it may
    import."""
    assert sorted(path.name for path in MODULE_UTILS.glob("*.py")) == []


def python_files_outside_common():
    roots = [
        REPO / name for name in ("plugins", "tests", "bench", "scripts", "roles", "cli", "molecule")
    ]
    common = MODULE_UTILS / "common"
    return sorted(
        path
        for root in roots
        for path in root.rglob("*.py")
        if common not in path.parents and "output" not in path.relative_to(REPO).parts
    )


def test_no_module_uses_a_moved_helper_from_the_module_it_left():
    found = {}
    for path in python_files_outside_common():
        moved = moved_helper_uses(path.read_text())
        if moved:
            found[str(path.relative_to(REPO))] = moved
    assert found == {}


def test_an_import_of_a_moved_helper_from_gates_is_reported():
    source = "from %s.rollout.gates import Gate, parse_timestamp, parse_number\n" % PACKAGE
    assert moved_helper_uses(source) == [
        "line 1: parse_timestamp from rollout.gates (now in common.clock)",
        "line 1: parse_number from rollout.gates (now in common.numbers)",
    ]


def test_a_moved_helper_read_from_the_module_it_left_is_reported():
    source = (
        "from %(p)s.rollout import rollout, gates as g\n"
        "import %(p)s.rollout.rollout as old_rollout\n"
        "from %(p)s.rollout.rollout import plan, parse_duration\n"
        "rollout.plan(None)\n"
        "rollout.parse_duration('2h', 'hold')\n"
        "old_rollout.parse_duration('2h', 'hold')\n"
        "g.utc_now()\n"
        "g.evaluate_gates()\n"
    ) % {"p": PACKAGE}
    assert moved_helper_uses(source) == [
        "line 3: parse_duration from rollout.rollout (now in common.clock)",
        "line 5: rollout.rollout.parse_duration (now in common.clock)",
        "line 6: rollout.rollout.parse_duration (now in common.clock)",
        "line 7: rollout.gates.utc_now (now in common.clock)",
    ]


def test_gates_no_longer_defines_the_moved_helpers():
    tree = ast.parse((MODULE_UTILS / "rollout" / "gates.py").read_text())
    defined = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    moved = {name for names in MOVED_FROM_GATES.values() for name in names}
    assert defined & moved == set()


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_module_no_longer_defines_what_left_it_and_its_new_home_does(old):
    def defined(relative):
        tree = ast.parse((MODULE_UTILS / relative).read_text())
        kinds = (ast.FunctionDef, ast.ClassDef)
        return {node.name for node in tree.body if isinstance(node, kinds)}

    for home, names in MOVED[old].items():
        assert defined(old.replace(".", "/") + ".py") & set(names) == set()
        assert set(names) <= defined(home.replace(".", "/") + ".py")
