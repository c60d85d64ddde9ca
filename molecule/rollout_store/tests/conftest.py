"""Where the member serves its clients, as the role wrote it in its settings: shared by the
scenario's checks of the member, its exporter and its upkeep."""

import pytest


@pytest.fixture(scope="module")
def endpoint(host):
    """The member's advertised client URL (https://ADDRESS:2379)."""
    settings = host.file("/etc/default/etcd").content_string
    line = next(
        line for line in settings.splitlines() if line.startswith("ETCD_ADVERTISE_CLIENT_URLS=")
    )
    return line.split("=", 1)[1]


@pytest.fixture(scope="module")
def address(endpoint):
    """The member's own address, from its client URL."""
    return endpoint.removeprefix("https://").rsplit(":", 1)[0]
