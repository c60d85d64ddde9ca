"""What the collection claims to support is what it is tested on.

- meta/runtime.yml's requires_ansible admits no ansible-core older than a feature the roles
  use, and scripts/test runs ansible-test sanity with every minor release it admits, up to
  the controller's (tests/sanity/ansible-core.txt), each with its ignore file.
- Every role names, as its platforms, only what its molecule scenario runs on: the sandbox
  node image's distribution and release.
"""

from __future__ import annotations

import pathlib
import re

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]

# Features the roles use and the ansible-core release that brought them.
FEATURE_MINIMUMS = {
    "ansible.builtin.meta: end_role": (2, 18),
}
# tests/sandbox/build-node-image.sh builds this; molecule and the sandbox fleet run on it.
NODE_IMAGE_PLATFORM = ("Debian", "bookworm")


def minor(text):
    parts = text.split(".")
    return int(parts[0]), int(parts[1])


def claimed_lower_bound():
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    match = re.fullmatch(r">=\s*(\d+\.\d+)(?:\.\d+)?", runtime["requires_ansible"])
    assert match, "requires_ansible should be one lower bound, not %r" % runtime["requires_ansible"]
    return minor(match.group(1))


def sanity_cores():
    lines = (REPO / "tests" / "sanity" / "ansible-core.txt").read_text().splitlines()
    return [line.split("==", 1)[1] for line in lines if line.startswith("ansible-core==")]


def controller_core():
    for line in (REPO / "requirements.txt").read_text().splitlines():
        if line.startswith("ansible-core=="):
            return line.split("==", 1)[1]
    raise AssertionError("requirements.txt pins no ansible-core")


def role_task_text():
    return "\n".join(p.read_text() for p in sorted((REPO / "roles").glob("*/tasks/*.yml")))


def test_the_node_image_is_the_platform_named_here():
    script = (REPO / "tests" / "sandbox" / "build-node-image.sh").read_text()
    assert re.search(r"^suite=%s$" % NODE_IMAGE_PLATFORM[1], script, re.M), (
        "the node image is no longer %s %s: update NODE_IMAGE_PLATFORM and the role platforms"
        % NODE_IMAGE_PLATFORM
    )


def test_requires_ansible_admits_nothing_older_than_what_the_roles_use():
    lower = claimed_lower_bound()
    tasks = role_task_text()
    for feature, needed in FEATURE_MINIMUMS.items():
        name = feature.split(": ")[1]
        if re.search(r"ansible\.builtin\.meta:\s*%s\b" % name, tasks):
            assert lower >= needed, "%s needs ansible-core %d.%d, requires_ansible says %d.%d" % (
                feature,
                *needed,
                *lower,
            )


def test_sanity_runs_with_every_ansible_core_the_claim_admits():
    lower = claimed_lower_bound()
    controller = minor(controller_core())
    listed = sorted(minor(core) for core in sanity_cores())
    wanted = [(controller[0], m) for m in range(lower[1], controller[1] + 1)]
    assert listed == wanted, (
        "tests/sanity/ansible-core.txt lists %s; requires_ansible and requirements.txt admit %s"
        % (listed, wanted)
    )
    assert controller_core() in sanity_cores(), "the controller's own ansible-core is not listed"
    for major, minor_ in listed:
        ignore = REPO / "tests" / "sanity" / ("ignore-%d.%d.txt" % (major, minor_))
        assert ignore.is_file(), "%s is missing" % ignore.relative_to(REPO)


def test_roles_claim_only_the_platform_they_are_tested_on():
    wrong = {}
    for meta in sorted((REPO / "roles").glob("*/meta/main.yml")):
        info = yaml.safe_load(meta.read_text())["galaxy_info"]
        claimed = {
            (platform["name"], str(version))
            for platform in info.get("platforms", [])
            for version in platform["versions"]
        }
        if claimed != {NODE_IMAGE_PLATFORM}:
            wrong[meta.parent.parent.name] = sorted(claimed)
        if minor(str(info["min_ansible_version"])) < claimed_lower_bound():
            wrong[meta.parent.parent.name + " min_ansible_version"] = info["min_ansible_version"]
    assert not wrong, "roles claim platforms or versions nobody tests: %s" % wrong
