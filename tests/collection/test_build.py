"""The built collection tarball: clean contents, installable, documented by ansible-doc."""

import json
import pathlib
import subprocess
import sys
import tarfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

MODULES = sorted(p.stem for p in (REPO / "plugins" / "modules").glob("[!_]*.py"))
ROLES = sorted(p.parent.parent.name for p in (REPO / "roles").glob("*/meta/argument_specs.yml"))
NOT_SHIPPED = (".venv/", ".collections/", "build/", "__pycache__", ".pyc", ".git/", "tests/output/")


@pytest.fixture(scope="module")
def installed(tmp_path_factory, ansible_env, tool):
    """Build the tarball and install it into a fresh collections path."""
    out = tmp_path_factory.mktemp("collection")
    subprocess.run(
        [tool("ansible-galaxy"), "collection", "build", "--output-path", str(out), str(REPO)],
        check=True,
        capture_output=True,
        env=ansible_env,
    )
    tarball = next(out.glob("zerolayer-fleet-*.tar.gz"))
    collections = out / "collections"
    # A machine that only has the tarball: no ansible.cfg, so the checkout's own collections
    # path (where zerolayer.fleet already "is") does not make the install a no-op.
    env = dict(ansible_env)
    env.pop("ANSIBLE_CONFIG", None)
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections)
    subprocess.run(
        [
            tool("ansible-galaxy"),
            "collection",
            "install",
            "--offline",
            "--no-deps",
            "-p",
            str(collections),
            str(tarball),
        ],
        check=True,
        capture_output=True,
        env=env,
        cwd=out,
    )
    assert (collections / "ansible_collections" / "zerolayer" / "fleet" / "MANIFEST.json").exists()
    return tarball, collections, env


def test_tarball_holds_no_venv_cache_or_test_output(installed):
    tarball, _, _ = installed
    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    leaked = [n for n in names if any(marker in n for marker in NOT_SHIPPED)]
    assert not leaked, f"tarball carries files that build_ignore should drop: {leaked[:20]}"
    assert "MANIFEST.json" in names


def ansible_doc(installed, tool, cwd, plugin_type, name):
    """`ansible-doc --json` of one plugin or role of the installed collection."""
    _, _, env = installed
    result = subprocess.run(
        [tool("ansible-doc"), "-t", plugin_type, "--json", f"zerolayer.fleet.{name}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[f"zerolayer.fleet.{name}"]


@pytest.mark.parametrize("module", MODULES)
def test_module_documentation_renders(installed, module, tmp_path, tool):
    doc = ansible_doc(installed, tool, tmp_path, "module", module)["doc"]
    assert doc["short_description"]
    assert doc["options"], f"{module} documents no options"


def test_split_filter_documentation_renders(installed, tmp_path, tool):
    doc = ansible_doc(installed, tool, tmp_path, "filter", "split_verdict")["doc"]
    assert set(doc["options"]) >= {"_input", "connections", "weight_pct", "sigmas", "floor_pct"}


@pytest.mark.parametrize("role", ROLES)
def test_role_argument_specs_render(installed, role, tmp_path, tool):
    entry = ansible_doc(installed, tool, tmp_path, "role", role)
    assert entry["entry_points"]["main"]["options"], f"{role} documents no options"


def test_execution_environment_definition_builds_a_context(installed, tmp_path, tool):
    """ansible-builder turns execution-environment.yml into a build context with the tarball."""
    tarball, _, env = installed
    for name in ("execution-environment.yml", "meta/ee-requirements.txt", "meta/ee-bindep.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    (tmp_path / "build").mkdir()
    (tmp_path / "build" / tarball.name).write_bytes(tarball.read_bytes())
    context = tmp_path / "context"
    result = subprocess.run(
        [tool("ansible-builder"), "create", "-f", "execution-environment.yml", "-c", str(context)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No matches" not in result.stdout, result.stdout
    containerfile = (context / "Containerfile").read_text()
    assert "ansible-core==2.19.14" in containerfile
    assert "pip install --no-cache-dir --no-deps" in containerfile
    assert "/ansible_collections/zerolayer/fleet/cli" in containerfile, "the zerolayer command"
    shipped = list((context / "_build").rglob(tarball.name))
    assert shipped, "the collection tarball is not in the build context"


PLAYBOOKS = sorted(p.stem for p in (REPO / "playbooks").glob("*.yml"))


@pytest.mark.parametrize("playbook", PLAYBOOKS)
def test_installed_playbook_parses_by_its_full_name(installed, playbook, tmp_path, tool):
    _, _, env = installed
    result = subprocess.run(
        [
            tool("ansible-playbook"),
            "-i",
            "localhost,",
            "--syntax-check",
            f"zerolayer.fleet.{playbook}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_installed_rollback_runs_by_its_full_name(installed, tmp_path, tool):
    """A real run of zerolayer.fleet.rollback from the tarball, on this machine as its only
    node, with a routectl that always fails (/bin/false): every play runs, the report names
    the node as not confirmed, the exit is non-zero, and nothing on the machine changes."""
    _, _, env = installed
    report = tmp_path / "rollback.json"
    result = subprocess.run(
        [
            tool("ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "zerolayer.fleet.rollback",
            "-e",
            "rollback_hosts=localhost",
            "-e",
            "rollback_routectl=/bin/false",
            "-e",
            f"rollback_report_path={report}",
            "-e",
            f"canary_record_dir={tmp_path}",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert "Rollback incomplete" in result.stdout, result.stdout[-3000:]
    facts = json.loads(report.read_text())
    assert (facts["mode"], facts["nodes_total"], facts["nodes_confirmed"]) == ("fast", 1, 0)
    assert facts["not_confirmed"] == ["localhost"]


def test_the_zerolayer_package_runs_the_installed_collection_s_command(installed, tmp_path):
    """cli/ (shipped in the collection) pip-installs a `zerolayer` console command that finds
    the collection where Ansible finds it: here the installed copy, run outside the checkout
    with no ansible.cfg."""
    _, collections, env = installed
    shipped = collections / "ansible_collections" / "zerolayer" / "fleet" / "cli"
    site = tmp_path / "site"
    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(shipped)],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert pip.returncode == 0, pip.stdout[-2000:] + pip.stderr[-2000:]
    command = site / "bin" / "zerolayer"
    assert command.exists(), sorted(p.name for p in site.iterdir())
    run_env = dict(env, PYTHONPATH=str(site))
    version = subprocess.run(
        [str(command), "--version"], env=run_env, cwd=tmp_path, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    manifest = json.loads((shipped.parent / "MANIFEST.json").read_text())
    assert version.stdout.strip() == "zerolayer %s" % manifest["collection_info"]["version"], (
        version.stdout + version.stderr
    )
    # The module the entry point ran is the installed collection's, not this checkout's.
    which = (
        "import zerolayer_cli; zerolayer_cli.main(['config', '--endpoints', 'https://e:2379']); "
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.controller "
        "import rollout_cli; "
        "print(rollout_cli.__file__)"
    )
    where = subprocess.run(
        [sys.executable, "-c", which], env=run_env, cwd=tmp_path, capture_output=True,
        text=True, check=False,
    )  # fmt: skip
    assert where.stdout.strip().splitlines()[-1].startswith(str(collections)), (
        where.stdout + where.stderr
    )
    nowhere = subprocess.run(
        [str(command), "config"], env=dict(run_env, ANSIBLE_COLLECTIONS_PATH=str(tmp_path / "no")),
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert nowhere.returncode == 2 and "collection is not installed" in nowhere.stderr, (
        nowhere.stderr
    )
