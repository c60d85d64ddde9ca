# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Load, attach, upgrade, detach and remove the router, and read its state.

An upgrade loads the new object against the pinned maps and swaps it into the
existing link with BPF_LINK_UPDATE: the netns is never without the program, and
routes, engine sockets and counters carry over.

A deep rollback (deep_rollback) keeps the router detached on this node until an explicit
restore: attach honours the mode recorded in the fence file (router_mode.py). detach and
remove are its building blocks and record no mode.
"""

from __future__ import annotations

import os

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    direct_drain,
    router_mode,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import raise_fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import load_program
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CONFIG_MAP,
    WriterLockTimeout,
    ensure_pin_dirs,
    missing_pins,
    opened,
    read_layout_config,
    require_bpffs,
    unlink_if_present,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import fenced_writer

SELF_NETNS = "/proc/self/ns/net"
# A deep rollback waits this long for another writer (an attach in its verifier, say),
# then goes ahead without the lock.
DEEP_ROLLBACK_LOCK_WAIT_S = 2.0


def netns_inode(netns_path, field="netns"):
    try:
        return os.stat(netns_path).st_ino
    except OSError as exc:
        raise FleetError(
            "%s %s cannot be opened: %s; give a netns file such as /run/netns/NAME "
            "or /proc/PID/ns/net" % (field, netns_path, exc.strerror),
            {"field": field, "path": netns_path},
        ) from None


def program_state(layout):
    """The pinned program's id, tag, name and statistics, or None when none is pinned."""
    if not os.path.exists(layout.prog):
        return None
    with opened(layout.prog) as fd:
        info = bpf_syscall.prog_info(fd)
    return {key: info[key] for key in ("id", "tag", "name", "run_cnt", "run_time_ns")}


def link_state(layout):
    """The pinned link: id, program, netns inode and whether it is still attached."""
    if not os.path.exists(layout.link):
        return None
    with opened(layout.link) as fd:
        info = bpf_syscall.link_info(fd)
    netns_ino = info.get("netns_ino", 0)
    # A force-detached link, or one whose netns is gone, reports netns inode 0.
    return {
        "id": info["id"],
        "prog_id": info["prog_id"],
        "netns_ino": netns_ino,
        "attached": netns_ino != 0,
    }


def router_state(layout):
    """Everything that tells whether and how the router runs; used as diff before/after."""
    program = program_state(layout)
    link = link_state(layout)
    return {
        "pin_dir": layout.pin_dir,
        "program": program,
        "link": link,
        "attached": bool(
            link and link["attached"] and program and link["prog_id"] == program["id"]
        ),
        "maps_pinned": not missing_pins(layout),
    }


def _load_fresh(layout, object_path, runner, seeds=None):
    """Load into an empty or map-only pin dir; reuse maps only if all of them are there."""
    missing = missing_pins(layout)
    if missing and len(missing) != len(layout.map_paths()):
        raise FleetError(
            "pin_dir %s holds only some router maps (missing: %s); remove it with state=absent "
            "(this drops routes) and attach again" % (layout.pin_dir, ", ".join(missing)),
            {"field": "pin_dir", "missing": missing},
        )
    load_program(
        object_path, layout.prog, layout, reuse_maps=not missing, runner=runner, seeds=seeds
    )


def _create_link(layout, netns_path):
    netns_fd = os.open(netns_path, os.O_RDONLY)
    try:
        with opened(layout.prog) as prog_fd:
            link_fd = bpf_syscall.link_create(prog_fd, netns_fd, bpf_syscall.BPF_SK_LOOKUP)
        try:
            bpf_syscall.obj_pin(link_fd, layout.link)
        except FleetError:
            bpf_syscall.link_detach(link_fd)
            raise
        finally:
            os.close(link_fd)
    finally:
        os.close(netns_fd)


def _upgrade_if_different(layout, object_path, link, want_netns, check_mode, runner):
    """Trial-load the object; swap it in if its tag differs. Returns the actions taken."""
    unlink_if_present(layout.next_prog)  # left over by an interrupted run
    current_tag = program_state(layout)["tag"]
    load_program(object_path, layout.next_prog, layout, reuse_maps=True, runner=runner)
    try:
        with opened(layout.next_prog) as new_fd:
            new_tag = bpf_syscall.prog_info(new_fd)["tag"]
            if new_tag == current_tag:
                return []
            actions = ["upgrade program %s -> %s" % (current_tag, new_tag)]
            if check_mode:
                return actions
            if link and link["attached"] and link["netns_ino"] == want_netns:
                with opened(layout.prog) as old_fd, opened(layout.link) as link_fd:
                    bpf_syscall.link_update(link_fd, new_fd, old_prog_fd=old_fd)
                actions.append("swap program in link %d" % link["id"])
            # bpffs has no rename: re-pin the new program under the stable name.
            os.unlink(layout.prog)
            bpf_syscall.obj_pin(new_fd, layout.prog)
            return actions
    finally:
        unlink_if_present(layout.next_prog)


def attach(
    layout,
    object_path,
    netns_path=SELF_NETNS,
    check_mode=False,
    runner=None,
    restore=False,
    move_netns=False,
    keep_seeds=False,
):
    """Make the router run object_path in netns_path; return changed/actions/before/after.

    On a node a deep rollback keeps detached, nothing is attached unless restore is set:
    the result then carries kept_detached (the mode record). With keep_seeds a restore
    uses the seeds the deep rollback kept (every tuple decided as before); without, the
    maps made again get new ones. move_netns allows taking the pinned link away from the
    netns it runs in.
    """
    if not os.path.isfile(object_path):
        raise FleetError(
            "object %s is not a file; build it with make -C files/bpf" % object_path,
            {"field": "object", "path": object_path},
        )
    require_bpffs(layout)
    want_netns = netns_inode(netns_path)
    before = router_state(layout)
    mode = router_mode.read_mode(layout.fence_file)
    if mode["mode"] == router_mode.DETACHED and not restore:
        return {
            "changed": False,
            "actions": [],
            "before": before,
            "after": before,
            "kept_detached": router_mode.shown(mode),
        }
    actions = []
    seeds = None
    if mode["mode"] == router_mode.DETACHED:
        actions.append("leave the detached mode of fence epoch %s" % mode.get("epoch"))
        if keep_seeds:
            seeds = router_mode.kept_seeds(mode)
            if seeds is None:
                raise FleetError(
                    "keep_seeds: the deep rollback of fence epoch %s kept no seeds on this "
                    "node; restore without keep_seeds (new seeds are drawn)" % mode.get("epoch"),
                    {"field": "keep_seeds"},
                )
            actions.append("use the seeds kept by the deep rollback")
    if not check_mode:
        if ensure_pin_dirs(layout):
            actions.append("create %s" % layout.pin_dir)

    def converge():
        link = link_state(layout)
        _refuse_netns_move(layout, link, netns_path, want_netns, move_netns)
        if program_state(layout) is None:
            actions.append("load program")
            if not check_mode:
                _load_fresh(layout, object_path, runner, seeds)
        else:
            if missing_pins(layout):
                raise FleetError(
                    "pin_dir %s has a program but not all maps; remove it with state=absent "
                    "and attach again" % layout.pin_dir,
                    {"field": "pin_dir", "missing": missing_pins(layout)},
                )
            link = _recover_interrupted_upgrade(layout, link, check_mode, actions)
            actions.extend(
                _upgrade_if_different(layout, object_path, link, want_netns, check_mode, runner)
            )
        program = None if check_mode else program_state(layout)
        if link is None:
            actions.append("create link in netns %d" % want_netns)
        elif not link["attached"] or link["netns_ino"] != want_netns:
            actions.append(
                "replace link %d (netns %d) with one in netns %d"
                % (link["id"], link["netns_ino"], want_netns)
            )
            if not check_mode:
                with opened(layout.link) as link_fd:
                    if link["attached"]:
                        bpf_syscall.link_detach(link_fd)
                os.unlink(layout.link)
        elif program is not None and link_state(layout)["prog_id"] != program["id"]:
            actions.append("point link %d at the pinned program" % link["id"])
            with opened(layout.link) as link_fd, opened(layout.prog) as prog_fd:
                bpf_syscall.link_update(link_fd, prog_fd)
        if not check_mode and not os.path.exists(layout.link):
            _create_link(layout, netns_path)

    # fenced_writer: a fast rollback while the maps were upgraded (weights copied) is not
    # undone by the copy.
    with fenced_writer(layout, "attach of %s" % object_path):
        converge()
        if not (restore or check_mode) and router_mode.is_detached(layout.fence_file):
            # A deep rollback came while this attach ran (it does not wait for the writer
            # lock): it wins, and this attach takes the router away again.
            remove(layout)
            after = router_state(layout)
            return {
                "changed": True,
                "actions": [*actions, "remove again: a deep rollback came meanwhile"],
                "before": before,
                "after": after,
                "kept_detached": router_mode.shown(router_mode.read_mode(layout.fence_file)),
            }
    if mode["mode"] == router_mode.DETACHED and not check_mode:
        # Only once the router runs again: a restore that fails leaves the node detached.
        router_mode.record_active(layout.fence_file, "restore")
    after = before if check_mode else router_state(layout)
    return {
        "changed": bool(actions),
        "actions": actions,
        "before": before,
        "after": after,
        "kept_detached": None,
    }


def _refuse_netns_move(layout, link, netns_path, want_netns, move_netns):
    """A pin dir serves one netns: attaching it elsewhere would leave the first one bare."""
    if move_netns or not link or not link["attached"] or link["netns_ino"] == want_netns:
        return
    raise FleetError(
        "netns %s (inode %d) is not the network namespace the router of pin_dir %s runs in "
        "(link %d, netns inode %d): attaching would move the router away from there and "
        "leave that netns without it; nothing was changed. Use another pin_dir for a second "
        "netns, or give move_netns=true (zerolayer-routectl attach --move-netns) to move it"
        % (netns_path, want_netns, layout.pin_dir, link["id"], link["netns_ino"]),
        {
            "field": "netns",
            "netns": netns_path,
            "netns_ino": want_netns,
            "link_netns_ino": link["netns_ino"],
            "pin_dir": layout.pin_dir,
        },
    )


def _recover_interrupted_upgrade(layout, link, check_mode, actions):
    """Point the link back at the pinned program when an upgrade stopped half way.

    An upgrade swaps the link's program, then re-pins the new one under prog. Stopped in
    between, the link runs a program that no pin names, and the next swap (which names the
    pinned program as the one it replaces) fails with EPERM. Both programs were loaded
    against the same maps, so running the pinned one again is safe; the upgrade that
    follows swaps the wanted one in. Returns the link's state after the repair.
    """
    if not link or not link["attached"]:
        return link
    pinned = program_state(layout)["id"]
    if link["prog_id"] == pinned:
        return link
    actions.append(
        "point link %d back at the pinned program %d (it ran program %d: an upgrade was "
        "interrupted before re-pinning)" % (link["id"], pinned, link["prog_id"])
    )
    if check_mode:
        return link
    with opened(layout.link) as link_fd, opened(layout.prog) as prog_fd:
        bpf_syscall.link_update(link_fd, prog_fd)
    return link_state(layout)


def _detach_link(layout, check_mode, actions):
    link = link_state(layout)
    if link is None:
        return
    if link["attached"]:
        actions.append("detach link %d" % link["id"])
        if not check_mode:
            # Unpinning alone would leave the program running while any fd holds the link.
            with opened(layout.link) as link_fd:
                bpf_syscall.link_detach(link_fd)
    actions.append("unpin link")
    if not check_mode:
        os.unlink(layout.link)


def detach(layout, check_mode=False):
    """Force-detach the link and unpin it; program and maps stay (routes survive).

    A building block: it records no mode, so the next attach runs the router again. A deep
    rollback is deep_rollback.
    """
    if os.path.isdir(layout.pin_dir):
        require_bpffs(layout)
    before = router_state(layout)
    actions = []
    _detach_link(layout, check_mode, actions)
    after = before if check_mode else router_state(layout)
    return {"changed": bool(actions), "actions": actions, "before": before, "after": after}


def remove(layout, check_mode=False):
    """Detach, then unpin program and maps and remove pin_dir: routes are gone.

    Records no mode either; deep_rollback calls it after keeping the router detached.
    """
    if not os.path.isdir(layout.pin_dir):
        state = router_state(layout)
        return {"changed": False, "actions": [], "before": state, "after": state}
    require_bpffs(layout)
    before = router_state(layout)
    actions = []
    _detach_link(layout, check_mode, actions)
    for path in [layout.prog, layout.next_prog, *layout.map_paths()]:
        if os.path.exists(path):
            actions.append("unpin %s" % os.path.basename(path))
            if not check_mode:
                os.unlink(path)
    for path in (layout.maps_dir, layout.pin_dir):
        if os.path.isdir(path):
            actions.append("remove %s" % path)
            if not check_mode:
                leftovers = os.listdir(path)
                if leftovers:
                    raise FleetError(
                        "%s holds pins this router does not own (%s); remove them first"
                        % (path, ", ".join(sorted(leftovers))),
                        {"field": "pin_dir", "path": path},
                    )
                os.rmdir(path)
    after = before if check_mode else router_state(layout)
    return {"changed": bool(actions), "actions": actions, "before": before, "after": after}


def _current_seeds(layout):
    """(seed_weight, seed_slot) of the pinned maps, or None (none pinned, or layout 1)."""
    if not os.path.exists(layout.map(CONFIG_MAP)):
        return None
    try:
        return read_layout_config(layout)[1:]
    except FleetError:
        return None  # a foreign layout's seeds are not worth keeping


def deep_rollback(layout, epoch=None, reason=None, check_mode=False):
    """The deep rollback, one and the same from routectl detach and the router module.

    In this order: raise the node's fence (to epoch, or one above its own) and record mode
    "detached" in the same write, so that from here on no writer with an older epoch raises
    a weight and no attach (boot unit, role, restart) runs the router again; then
    force-detach the link, so the kernel's own lookup gives every new connection to the
    proxy; then unpin program and maps. A restore starts from the inventory's routes.
    Returns changed/actions/before/after, the fence epochs and the mode record.
    """
    mode_before = router_mode.read_mode(layout.fence_file)
    epoch_before, epoch_after = raise_fence(
        layout.fence_file,
        epoch,
        "deep rollback",
        check_mode,
        record=router_mode.detached_record(layout.fence_file, reason, _current_seeds(layout)),
    )
    actions = []
    if epoch_after != epoch_before:
        actions.append("raise the fence epoch %d -> %d" % (epoch_before, epoch_after))
    if mode_before["mode"] != router_mode.DETACHED or mode_before.get("epoch") != epoch_after:
        actions.append("keep the router detached from fence epoch %d" % epoch_after)
    try:
        with writer_lock(layout, "deep rollback", timeout=DEEP_ROLLBACK_LOCK_WAIT_S):
            result = remove(layout, check_mode)
    except WriterLockTimeout as exc:
        # Never wait longer: a holder reads the mode as it leaves its lock and removes the
        # router again itself (attach does).
        actions.append("went ahead without the writer lock (%s)" % exc.message)
        result = remove(layout, check_mode)
    actions.extend(result["actions"])
    if not check_mode:
        direct_drain.note_all_zero(layout, "deep rollback", epoch_after)
    return {
        "changed": bool(actions),
        "actions": actions,
        "before": result["before"],
        "after": result["after"],
        "fence": {"epoch_before": epoch_before, "epoch": epoch_after},
        "mode": router_mode.shown(
            router_mode.read_mode(layout.fence_file) if not check_mode else mode_before
        ),
    }
