# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The addresses this machine's connections to some hosts come from, as host CIDRs.

The drill's cohort stage makes its own load client the cohort: the nodes see the client by
the address the controller's kernel picks for each node. A connected UDP socket asks the
kernel that question (route and source selection) without sending a packet.
"""

from __future__ import annotations

import ipaddress
import socket

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def source_address(host, port=9):
    """The local address a connection from here to host would come from."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError) as exc:
        raise FleetError(
            "source_address: %r does not resolve to an address (%s)" % (host, exc),
            {"field": "host", "value": host},
        ) from None
    family, kind, proto, _name, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        try:
            probe.connect(address)
        except OSError as exc:
            raise FleetError(
                "source_address: no route from here to %s (%s)" % (host, exc),
                {"field": "host", "value": host},
            ) from None
        return probe.getsockname()[0]


def source_cidrs(hosts):
    """Sorted unique host networks (/32, /128) of the source addresses toward hosts."""
    networks = {ipaddress.ip_network(source_address(str(host))) for host in hosts}
    return [str(n) for n in sorted(networks, key=lambda n: (n.version, n.network_address))]
