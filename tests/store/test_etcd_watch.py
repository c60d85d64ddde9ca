"""The etcd client's watch against a real etcd: a watch asked from a revision the store has
compacted away is cancelled by the store; the client ends it at once (StoreUnavailable, with
the oldest revision kept), and a watch from a fresh read's revision sees the next change."""

import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (
    EtcdClient,
    StoreUnavailable,
    _b64,
)

from .etcd_member import running_etcd

KEY = "/zlt-watch/fence"


def test_a_watch_from_a_compacted_revision_ends_at_once_and_a_fresh_one_sees_the_next_change():
    with running_etcd() as member:
        client = EtcdClient(member.url, timeout=3)
        first = client.put(KEY, '{"epoch": 1}')
        for epoch in (2, 3):
            latest = client.put(KEY, '{"epoch": %d}' % epoch)
        client.call("/v3/kv/compaction", {"revision": str(latest), "physical": True})

        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as cancelled:
            next(iter(client.watch(KEY, first + 1, timeout=20)))
        # Before, the cancelled watch read as an idle one: the caller waited out its timeout.
        assert time.monotonic() - started < 5
        assert cancelled.value.details["compact_revision"] == latest
        assert "compacted" in cancelled.value.message

        fresh = client.revision(client.call("/v3/kv/range", {"key": _b64(KEY)}))
        changes = client.watch(KEY, fresh + 1, timeout=20)
        client.put(KEY, '{"epoch": 4}')
        (kv,) = next(iter(changes))
        assert kv.json() == {"epoch": 4}


def test_a_watch_cancelled_for_another_reason_is_an_error_not_an_idle_store():
    """A denied permission must not read as "read again at once" (a tight loop): the
    watcher reports it and retries later."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import _cancelled

    denied = _cancelled(KEY, 7, {"canceled": True, "cancel_reason": "permission denied"}, [])
    assert not isinstance(denied, StoreUnavailable)
    assert "permission denied" in denied.message and KEY in denied.message
