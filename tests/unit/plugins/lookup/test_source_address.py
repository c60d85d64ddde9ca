"""The controller's own source address toward hosts (lookup zerolayer.fleet.source_address),
asked of this machine's kernel with a connected UDP socket: no packet leaves the machine."""

import pytest
from ansible.errors import AnsibleLookupError
from ansible_collections.zerolayer.fleet.plugins.lookup.source_address import LookupModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller.source_addresses import (
    source_address,
    source_cidrs,
)


def test_a_loopback_host_is_reached_from_the_address_the_loopback_holds():
    # The kernel picks lo's own 127.0.0.1 for any of 127.0.0.0/8, not the destination.
    assert source_address("127.0.0.7") == "127.0.0.1"


def test_the_addresses_are_distinct_host_networks_sorted_v4_first():
    assert source_cidrs(["::1", "127.0.0.9", "127.0.0.2", "localhost"]) == [
        "127.0.0.1/32",
        "::1/128",
    ]


def test_a_host_that_does_not_resolve_is_named():
    with pytest.raises(FleetError) as caught:
        source_address("no-such-host.invalid")
    assert "no-such-host.invalid" in caught.value.message
    assert caught.value.details["field"] == "host"


def test_the_lookup_returns_the_cidrs_and_refuses_no_hosts():
    lookup = LookupModule()
    assert lookup.run(["127.0.0.3"]) == ["127.0.0.1/32"]
    with pytest.raises(AnsibleLookupError, match="at least one host"):
        lookup.run([])
