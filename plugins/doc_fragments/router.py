# Copyright: zerolayer.fleet maintainers
# Apache-2.0 (see LICENSE)
"""Documentation shared by the modules that work on the router's pinned maps."""


class ModuleDocFragment:
    # The pin directory every router module reads or writes.
    DOCUMENTATION = r"""
options:
  pin_dir:
    description: Directory on a bpffs holding the router's pins.
    type: path
    default: /sys/fs/bpf/zerolayer
  fence_file:
    description:
      - File, outside bpffs, where the node keeps the highest fence epoch it has seen (so that
        a reboot or a router upgrade keeps it). See docs/rollout-store.md.
      - It is the node's, not the caller's. Where the node config C(/etc/zerolayer/router.json)
        (written by the P(zerolayer.fleet.ebpf_router#role) role) is this router's (it names this
        O(pin_dir), or none and O(pin_dir) is the default), its C(fence_file) is used (the default
        stands for it), and any other value fails naming both, changing nothing. Elsewhere (a
        router attached by hand) the value given stands.
    type: path
    default: /var/lib/zerolayer/fence.json
"""

    # Modules whose writes carry the writer's fence epoch.
    EPOCH = r"""
options:
  epoch:
    description:
      - The fence epoch this writer took from the rollout store (the canary, the engine upgrade
        and restore take it at their start).
      - A write that sends more traffic to the engine with an epoch older than the node's fence
        is refused, naming both epochs, and changes nothing; a rollback or abort raised the fence
        after this writer took its epoch. A higher epoch is recorded as the node's new fence.
      - Omitted, the write carries epoch 0, which the node admits only until its first fence.
      - An epoch above the node's fence is checked against the rollout store's fence epoch,
        through the store client settings of the node's fence watcher
        (C(/etc/zerolayer/store.json)); one above the store's cannot raise traffic. A store
        that does not answer does not stop the write, which then returns a warning.
    type: int
"""

    # Modules that change kernel state: full check mode and diff mode.
    CHANGES = r"""
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying
      target.
    support: full
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode),
      when in diff mode.
    support: full
"""
