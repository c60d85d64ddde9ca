"""The node artifact (module_utils/node/node_artifact.py): built the same from the same sources,
holding every module its commands import, run through the links the role makes, installed
and upgraded without a moment without a command, and a running command keeps its version."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_artifact

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
MODULE_UTILS = os.path.join(REPO, "plugins", "module_utils")
PYTHON = "/usr/bin/python3"


def built(tmp_path, name="build", root=REPO):
    return node_artifact.build(root, str(tmp_path / name))


def source_copy(tmp_path, change):
    """A copy of the collection's galaxy.yml and module_utils with one line added to
    common/errors.py: another version, with other offsets in its zip."""
    root = tmp_path / ("src-%s" % change)
    shutil.copytree(MODULE_UTILS, root / "plugins" / "module_utils")
    shutil.copy(os.path.join(REPO, "galaxy.yml"), root / "galaxy.yml")
    with open(root / "plugins" / "module_utils" / "common" / "errors.py", "a") as handle:
        handle.write("\n# %s\n%s\n" % (change, "#" * 4000))
    return str(root)


def test_the_same_sources_build_the_same_bytes(tmp_path):
    first, second = built(tmp_path, "a"), built(tmp_path, "b")
    assert first["sha256"] == second["sha256"]
    assert first["name"] == second["name"] == "zerolayer-node-%s.pyz" % first["version"]
    base, _plus, digest = first["version"].partition("+")
    assert base == node_artifact.collection_version(REPO)
    assert len(digest) == 12 and int(digest, 16) >= 0


def test_a_second_build_of_the_same_sources_reads_the_first_and_mends_a_changed_archive(
    tmp_path,
):
    first = built(tmp_path)
    (index,) = (tmp_path / "build").glob("sources-*.json")
    assert json.loads(index.read_text()) == first
    assert built(tmp_path) == first
    # An archive changed since is built again, not handed out.
    with open(first["path"], "ab") as handle:
        handle.write(b"junk")
    again = built(tmp_path)
    assert again == first and node_artifact.sha256_of(first["path"]) == first["sha256"]


def test_a_change_in_a_module_is_another_version(tmp_path):
    assert built(tmp_path)["version"] != built(tmp_path, root=source_copy(tmp_path, "x"))["version"]


def test_it_holds_what_the_commands_import_and_nothing_of_the_controller(tmp_path):
    artifact = built(tmp_path)
    with zipfile.ZipFile(artifact["path"]) as archive:
        manifest = json.loads(archive.read(node_artifact.MANIFEST))
        names = set(archive.namelist())
    assert manifest["version"] == artifact["version"]
    assert sorted(manifest["commands"]) == sorted(node_artifact.COMMANDS)
    for module in (
        "node.node_cli",
        "node.fence_watcher",
        "node.exposition",
        "telemetry.store_exporter",
        "common.errors",
    ):
        assert module in manifest["modules"]
    # notify: the sinks are secrets the nodes and the store's exporter never read.
    for controller_only in (
        "reports.drill",
        "controller.rollout_cli",
        "rollout.push_shards",
        "canary_gate",
        "reports.notify",
    ):
        assert controller_only not in manifest["modules"]
    package = node_artifact.PACKAGE.replace(".", "/")
    files = {node_artifact.module_file(MODULE_UTILS, m) for m in manifest["modules"]}
    assert {"%s/%s" % (package, f) for f in files} <= names
    with open(artifact["path"], "rb") as handle:
        assert handle.readline() == b"#!/usr/bin/python3 -sS\n"


def test_a_gpu_nodes_commands_carry_no_rollout_code():
    """zerolayer-routectl, its watcher, the engines' hook and the route exporter follow the
    layers' rule: what they import holds nothing of the rollout, the telemetry, the reports or
    the controller (the store's exporter, on the store's members, reads the records)."""
    on_a_gpu_node = {
        module
        for command, (module, _function) in node_artifact.COMMANDS.items()
        if command != "zerolayer-store-exporter"
    }
    held = node_artifact.module_closure(MODULE_UTILS, on_a_gpu_node | {"node.node_artifact"})
    assert "node.exposition" in held and "common.record_codec" in held
    above = ("rollout", "telemetry", "reports", "controller")
    assert [module for module in held if module.split(".")[0] in above] == []


def test_every_module_it_holds_imports_from_it_alone(tmp_path):
    """Each module, function-local imports included, imported from the archive by the
    node's interpreter with nothing else on its path (-I: no site-packages, no cwd)."""
    artifact = built(tmp_path)
    with zipfile.ZipFile(artifact["path"]) as archive:
        modules = json.loads(archive.read(node_artifact.MANIFEST))["modules"]
    script = (
        "import sys; sys.path.insert(0, %r)\n"
        "import importlib\n"
        "for name in %r:\n"
        "    module = importlib.import_module(%r + '.' + name)\n"
        "    assert '.pyz' in module.__file__, module.__file__\n"
    ) % (artifact["path"], modules, node_artifact.PACKAGE)
    run = subprocess.run([PYTHON, "-I", "-c", script], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    # The AST closure saw every import: none of them names a module left out.
    for name in modules:
        with open(os.path.join(MODULE_UTILS, node_artifact.module_file(MODULE_UTILS, name))) as f:
            assert node_artifact.package_imports(f.read(), MODULE_UTILS) <= set(modules), name


def test_a_package_of_module_utils_goes_with_its_own_init_file(tmp_path):
    artifact = built(tmp_path)
    package = node_artifact.PACKAGE.replace(".", "/")
    with zipfile.ZipFile(artifact["path"]) as archive:
        held = archive.read("%s/common/__init__.py" % package)
    with open(os.path.join(MODULE_UTILS, "common", "__init__.py"), "rb") as handle:
        assert held == handle.read()
    assert {"common", "common.errors"} <= set(artifact["modules"])


def test_imports_name_modules_of_packages_and_names_of_modules(tmp_path):
    source = tmp_path / "module_utils"
    (source / "layer").mkdir(parents=True)
    (source / "layer" / "__init__.py").write_text("")
    for name in ("layer/one.py", "layer/two.py", "flat.py"):
        (source / name).write_text("")
    package = node_artifact.PACKAGE
    (source / "entry.py").write_text(
        "from %s.layer import one\n"
        "from %s.layer.two import SOMETHING\n"
        "from %s import flat\n"
        "def later():\n"
        "    import %s.layer.one\n" % (package, package, package, package)
    )
    imports = node_artifact.package_imports((source / "entry.py").read_text(), str(source))
    assert imports == {"layer.one", "layer.two", "flat"}
    closure = node_artifact.module_closure(str(source), ["entry"])
    assert closure == ["entry", "flat", "layer", "layer.one", "layer.two"]
    assert node_artifact.module_file(str(source), "layer") == "layer/__init__.py"
    assert node_artifact.module_file(str(source), "layer.one") == "layer/one.py"


def test_a_change_in_a_package_is_a_change_of_the_sources(tmp_path):
    """What a build is kept by (sources_key) covers the packages' files too."""
    root = source_copy(tmp_path, "a")
    source_dir = os.path.join(root, "plugins", "module_utils")
    before = node_artifact.sources_key(source_dir, "1.0.0")
    with open(os.path.join(source_dir, "common", "clock.py"), "a") as handle:
        handle.write("\n# changed\n")
    assert node_artifact.sources_key(source_dir, "1.0.0") != before


def links(tmp_path, artifact):
    """The role's layout in a temp dir: lib/zerolayer-node.pyz -> the version, sbin/COMMAND
    -> lib/zerolayer-node.pyz."""
    lib, sbin = tmp_path / "lib", tmp_path / "sbin"
    lib.mkdir(exist_ok=True)
    sbin.mkdir(exist_ok=True)
    node_artifact.install(
        artifact["path"],
        str(lib),
        str(sbin),
        sorted(node_artifact.COMMANDS),
        artifact["name"],
        artifact["sha256"],
    )
    return lib, sbin


def test_each_command_runs_as_its_link_is_named_and_tells_its_version(tmp_path):
    artifact = built(tmp_path)
    _lib, sbin = links(tmp_path, artifact)
    for command in node_artifact.COMMANDS:
        version = subprocess.run(
            [str(sbin / command), "--version"], capture_output=True, text=True, check=False
        )
        assert version.returncode == 0, version.stderr
        assert version.stdout == "%s (zerolayer node artifact) %s\n" % (
            command,
            artifact["version"],
        )
        # The command itself answers (zerolayer-register-engine takes no --help: its usage).
        usage = subprocess.run(
            [str(sbin / command), "--help"], capture_output=True, text=True, check=False
        )
        assert usage.returncode in (0, 2), usage.stderr
        assert "usage: %s" % command in usage.stdout + usage.stderr
    alone = subprocess.run([PYTHON, artifact["path"]], capture_output=True, text=True, check=False)
    assert alone.returncode == 2 and "zerolayer-routectl" in alone.stderr
    by_name = subprocess.run(
        [PYTHON, artifact["path"], "zerolayer-routectl", "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert by_name.stdout.startswith("zerolayer-routectl (zerolayer node artifact) ")


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port, deadline_s=20):
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            url = "http://127.0.0.1:%d/metrics" % port
            with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310 (http only)
                return answer.read().decode()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_running_exporter_keeps_its_version_through_an_upgrade(tmp_path):
    """The exporter imports lazily, at its first scrape: started from the first version,
    scraped after the links moved to a second, it still runs (and reports) the first."""
    first = built(tmp_path, "first")
    lib, sbin = links(tmp_path, first)
    second = built(tmp_path, "second", root=source_copy(tmp_path, "second"))
    port = free_port()
    exporter = subprocess.Popen(
        [
            str(sbin / "zerolayer-route-exporter"),
            "--listen-address", "127.0.0.1",
            "--port", str(port),
            "--pin-dir", str(tmp_path / "no-router"),
            "--rollout-record=",
            "--fence-watcher-status", str(tmp_path / "no-watcher.json"),
            "--fence-file", str(tmp_path / "fence.json"),
        ],
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        # Wait until it listens, without scraping (a scrape would import everything now).
        deadline = time.monotonic() + 20
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert exporter.poll() is None, exporter.stderr.read().decode()
            assert time.monotonic() < deadline, "the exporter did not listen"
            time.sleep(0.1)
        node_artifact.install(
            second["path"],
            str(lib),
            str(sbin),
            sorted(node_artifact.COMMANDS),
            second["name"],
            second["sha256"],
        )
        assert os.readlink(lib / node_artifact.CURRENT_LINK) == second["name"]
        text = scrape(port)
        assert 'zerolayer_node_artifact_info{version="%s"} 1' % first["version"] in text, text
        assert "zerolayer_router_attached 0" in text
    finally:
        os.killpg(exporter.pid, 15)
        exporter.wait(timeout=30)
    started_after = subprocess.run(
        [str(sbin / "zerolayer-route-exporter"), "--version"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert second["version"] in started_after.stdout


def test_an_upgrade_keeps_the_previous_version_and_removes_older_ones(tmp_path):
    versions = [built(tmp_path, "v%d" % n, root=source_copy(tmp_path, "v%d" % n)) for n in range(3)]
    lib, sbin = tmp_path / "lib", tmp_path / "sbin"
    lib.mkdir()
    sbin.mkdir()
    legacy = lib / "ansible_collections" / "zerolayer"
    legacy.mkdir(parents=True)
    commands = ["zerolayer-routectl", "zerolayer-route-exporter"]
    # An earlier release's command file is replaced by the link.
    (sbin / "zerolayer-routectl").write_text("#!/usr/bin/python3\n")

    def install(artifact, source=True):
        return node_artifact.install(
            artifact["path"] if source else None,
            str(lib),
            str(sbin),
            commands,
            artifact["name"],
            artifact["sha256"],
            remove=[str(lib / "ansible_collections")],
        )

    first = install(versions[0])
    assert first["copy"] and first["link"] and first["previous"] is None
    assert first["remove"] == [str(lib / "ansible_collections")] and not legacy.exists()
    for command in commands:
        assert os.readlink(sbin / command) == str(lib / node_artifact.CURRENT_LINK)
    install(versions[1])
    assert node_artifact.installed_versions(str(lib)) == sorted(v["name"] for v in versions[:2])
    third = install(versions[2])
    assert third["previous"] == versions[1]["name"] and third["stale"] == [versions[0]["name"]]
    assert node_artifact.installed_versions(str(lib)) == sorted(v["name"] for v in versions[1:])
    # Again, with nothing to copy: nothing changes, the previous version stays.
    again = install(versions[2], source=False)
    assert not (again["copy"] or again["link"] or again["commands"] or again["stale"])
    assert node_artifact.installed_versions(str(lib)) == sorted(v["name"] for v in versions[1:])


def test_a_copy_that_does_not_match_its_checksum_changes_nothing(tmp_path):
    artifact = built(tmp_path)
    lib, sbin = tmp_path / "lib", tmp_path / "sbin"
    lib.mkdir()
    sbin.mkdir()
    with pytest.raises(FleetError) as refused:
        node_artifact.install(
            artifact["path"], str(lib), str(sbin), ["zerolayer-routectl"], artifact["name"], "0" * 9
        )
    assert refused.value.details["field"] == "sha256"
    assert sorted(os.listdir(lib)) == [] and sorted(os.listdir(sbin)) == []


def test_the_plan_changes_nothing(tmp_path):
    artifact = built(tmp_path)
    lib, sbin = tmp_path / "lib", tmp_path / "sbin"
    lib.mkdir()
    sbin.mkdir()
    plan = node_artifact.install_plan(
        str(lib), str(sbin), ["zerolayer-routectl"], artifact["name"], artifact["sha256"]
    )
    assert plan["copy"] and plan["link"] and plan["commands"] == ["zerolayer-routectl"]
    assert os.listdir(lib) == [] and os.listdir(sbin) == []


def test_a_module_imported_but_missing_is_named(tmp_path):
    source = tmp_path / "module_utils"
    source.mkdir()
    (source / "entry.py").write_text("from %s import gone\n" % node_artifact.PACKAGE)
    with pytest.raises(FleetError) as missing:
        node_artifact.module_closure(str(source), ["entry"])
    assert missing.value.details["module"] == "gone"


def test_outside_an_artifact_the_version_says_so():
    assert node_artifact.installed_version() is None
    assert sys.modules[node_artifact.__name__] is node_artifact
