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
