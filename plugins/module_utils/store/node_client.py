# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A node's way to the rollout store: its store.json, as the rollout_store role's node_client
writes it. The fence watcher, the node's commands and a weight writer checking the store's
fence epoch (dataplane/fence.py) all reach the store through it, with the same credentials."""

from __future__ import annotations

import json

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
)

# store.json's names for the TLS files -> store_from_params's.
TLS_FILE_PARAMS = {"ca": "ca_file", "cert": "cert_file", "key": "key_file"}


def node_store(path, timeout=None):
    """(RolloutStore, node name) from the node's store client settings at path (endpoints,
    ca, cert, key, user, password_file, prefix, node)."""
    try:
        with open(path) as handle:
            settings = json.load(handle)
    except FileNotFoundError:
        raise FleetError(
            "store config %s does not exist; the rollout_store role's node_client writes it" % path,
            {"field": "store_config", "path": path},
        ) from None
    except (OSError, ValueError) as exc:
        raise FleetError(
            "store config %s cannot be read as JSON: %s" % (path, exc),
            {"field": "store_config", "path": path},
        ) from None
    if not isinstance(settings, dict) or not settings.get("endpoints"):
        raise FleetError(
            "store config %s names no endpoints" % path, {"field": "store_config", "path": path}
        )
    params = {TLS_FILE_PARAMS.get(key, key): value for key, value in settings.items()}
    if timeout is not None:
        params["timeout"] = timeout
    return store_from_params(params), settings.get("node")
