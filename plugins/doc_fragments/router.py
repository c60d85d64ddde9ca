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
