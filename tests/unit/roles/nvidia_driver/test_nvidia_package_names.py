"""The nvidia_driver role's Ubuntu package names against the names Ubuntu's archive really
has (tests/fixtures/packages/ubuntu-*.txt, recorded by record-ubuntu.sh from
archive.ubuntu.com), not against a restatement of the role's vars.

For every branch the role accepts on Ubuntu (vars/Ubuntu.yml), every kernel module flavour
the role would choose for it (open only from branch 515) and both module sources, the names
the role's own package table renders must exist in 22.04 and 24.04. linux-headers-<kernel>
is named after the node's running kernel and is left out.

Debian 12 and the RHEL family take their driver packages from NVIDIA's CUDA repository,
which cannot be reached from here: their names are not checked this way.
"""

from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, StrictUndefined

REPO = Path(__file__).resolve().parents[4]
UBUNTU_VARS = REPO / "roles/nvidia_driver/vars/Ubuntu.yml"
FIXTURES = REPO / "tests/fixtures/packages"
RELEASES = ("22.04", "24.04")
# The open kernel modules start with this branch (roles/nvidia_driver select_packages.yml).
FIRST_OPEN_BRANCH = 515


def archive_names(release):
    lines = (FIXTURES / ("ubuntu-%s.txt" % release)).read_text().splitlines()
    return {line for line in lines if line and not line.startswith("#")}


def ubuntu_vars():
    return yaml.safe_load(UBUNTU_VARS.read_text())


def render(template, branch):
    context = {
        "nvidia_driver_branch": branch,
        "_nvidia_driver_ubuntu_flavour": "generic",
        # No version pinned: the bare package name.
        "_nvidia_driver_deb_version": "",
        "ansible_facts": {"kernel": "6.8.0-41-generic"},
    }
    environment = Environment(undefined=StrictUndefined)  # noqa: S701 - package names, not HTML
    return environment.from_string(template).render(context)


def selections():
    variables = ubuntu_vars()
    table = variables["_nvidia_driver_package_table"]
    for branch in variables["_nvidia_driver_known_branches"]:
        flavours = ["proprietary"] + (["open"] if int(branch) >= FIRST_OPEN_BRANCH else [])
        for source in variables["_nvidia_driver_module_sources"]:
            for flavour in flavours:
                names = [render(name, branch) for name in table[source][flavour]]
                names += [
                    render(name, branch)
                    for name in variables["_nvidia_driver_fabricmanager_package_list"]
                ]
                yield branch, source, flavour, names


@pytest.mark.parametrize("release", RELEASES)
def test_every_name_the_role_can_select_exists_in_the_archive(release):
    known = archive_names(release)
    assert len(known) > 1000, "the fixture for %s looks empty" % release
    missing = []
    checked = 0
    for branch, source, flavour, names in selections():
        for name in names:
            if name.startswith("linux-headers-"):
                continue
            checked += 1
            if name not in known:
                missing.append((branch, source, flavour, name))
    assert checked > 50
    assert not missing, "Ubuntu %s has no such packages: %s" % (release, missing)


def test_the_reference_package_exists_for_every_branch():
    variables = ubuntu_vars()
    for release in RELEASES:
        known = archive_names(release)
        for branch in variables["_nvidia_driver_known_branches"]:
            assert render(variables["_nvidia_driver_reference_package"], branch) in known


def test_the_check_sees_a_name_the_archive_lacks():
    # Branch 560 has no -server packages in either release: had the role kept it, the
    # check above would have named every one of its packages.
    known = archive_names("24.04")
    assert render("nvidia-utils-{{ nvidia_driver_branch }}-server", "560") not in known
    assert render("nvidia-utils-{{ nvidia_driver_branch }}-server", "550") in known
    # And branch 470 has no open kernel modules, which is why the role chooses them from 515.
    assert "nvidia-headless-470-server-open" not in known
    assert "nvidia-headless-470-server" in known
