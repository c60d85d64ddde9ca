"""A bad value fails the role in its preflight with a message naming the key and the
allowed values, and nothing on the node changes."""

import json
import os
import subprocess
from pathlib import Path

import pytest
import testinfra.utils.ansible_runner

INVENTORY = os.environ["MOLECULE_INVENTORY_FILE"]
testinfra_hosts = testinfra.utils.ansible_runner.AnsibleRunner(INVENTORY).get_hosts("gpu_nodes")[:1]

SCENARIO = Path(__file__).resolve().parent.parent
SYSCTL_FILE = "/etc/sysctl.d/60-zerolayer-kernel-tuning.conf"

SOMAXCONN_RANGE = "allowed: an integer from 1 to 2147483647"
BAD_CASES = [
    ({"net.core.somaxconn": "lots"}, "['net.core.somaxconn'] is \"lots\"; " + SOMAXCONN_RANGE),
    ({"net.core.somaxconn": 0}, "['net.core.somaxconn'] is 0; " + SOMAXCONN_RANGE),
    ({"net.ipv4.tcp_syncookies": 3}, "tcp_syncookies'] is 3; allowed: an integer from 0 to 2"),
    ({"net.ipv4.ip_local_port_range": "60000 1024"}, "1 <= LOW <= HIGH <= 65535"),
    ({"net.ipv4.ip_local_port_range": "1024"}, "['net.ipv4.ip_local_port_range'] is \"1024\""),
    ({"net.ipv4.tcp_rmem": "4096 big"}, 'tcp_rmem\'] is "4096 big"; allowed: an integer'),
    ({"not a key": 1}, '"not a key" is not a sysctl name'),
]


@pytest.fixture(scope="module")
def outcomes(host, tmp_path_factory):
    """Runs every bad case against the node in one playbook run."""
    before = {
        "file": host.file(SYSCTL_FILE).sha256sum,
        "somaxconn": host.file("/proc/sys/net/core/somaxconn").content_string,
    }
    outcomes_file = tmp_path_factory.mktemp("bad-input") / "outcomes.json"
    extra_vars = {
        "kernel_tuning_bad_cases": [case for case, _ in BAD_CASES],
        "kernel_tuning_bad_outcomes_file": str(outcomes_file),
    }
    result = subprocess.run(
        [
            "ansible-playbook",
            "-i",
            INVENTORY,
            "--limit",
            host.backend.get_hostname(),
            "-e",
            json.dumps(extra_vars),
            str(SCENARIO / "reject_bad_input.yml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return before, json.loads(outcomes_file.read_text())


@pytest.mark.parametrize(("index", "expected_message"), list(enumerate(m for _, m in BAD_CASES)))
def test_bad_value_fails_in_preflight_naming_the_key(outcomes, index, expected_message):
    _, results = outcomes
    assert len(results) == len(BAD_CASES)
    outcome = results[index]
    assert outcome["failed"] is True, outcome
    assert outcome["task"].startswith("Check"), outcome
    assert expected_message in " ".join(outcome["msg"].split()), outcome


def test_bad_values_changed_nothing(host, outcomes):
    before, _ = outcomes
    assert host.file(SYSCTL_FILE).sha256sum == before["file"]
    assert host.file("/proc/sys/net/core/somaxconn").content_string == before["somaxconn"]
