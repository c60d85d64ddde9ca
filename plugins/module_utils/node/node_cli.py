# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""zerolayer-routectl: the node-local command line over the router's Python code.

The role installs a few-line script that calls main(); playbooks reach it with the
`raw` module (rollback must not wait for a Python module round trip), operators
and systemd units call it directly. Every subcommand prints one JSON line.

Exit status: 0 done; 2 rejected (bad input, or a state that forbids the action:
the JSON names the field); 1 the kernel or the system refused (JSON carries the
errno). Each subcommand imports only what it needs, so `rollback` starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import UsageError

DEFAULT_CONFIG = "/etc/zerolayer/router.json"
DEFAULT_PIN_DIR = "/sys/fs/bpf/zerolayer"
DEFAULT_OBJECT = "/usr/local/lib/zerolayer/zerolayer_router.bpf.o"
DEFAULT_FENCE_FILE = "/var/lib/zerolayer/fence.json"
DEFAULT_STORE_CONFIG = "/etc/zerolayer/store.json"
DEFAULT_WATCH_STATUS = "/run/zerolayer/fence-watcher.json"
WRITER_EPOCH_HELP = (
    "the writer's fence epoch from the rollout store; a raise of traffic with an epoch older "
    "than the node's fence is refused (default: none, i.e. 0)"
)
FENCE_EPOCH_HELP = (
    "the fence epoch the rollback raised in the rollout store; the node keeps the higher of "
    "it and its own (default: one above the node's own)"
)
DEFAULT_REGISTER_TIMEOUT_S = 30.0
# At boot an engine may not listen yet; its own start hook registers it later.
ATTACH_REGISTER_TIMEOUT_S = 2.0

EXIT_OK = 0
EXIT_SYSTEM = 1
EXIT_REJECTED = 2


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of printing usage and exiting, so errors stay JSON."""

    def error(self, message):
        raise UsageError(message, _field_in(message))


def _field_in(message):
    """The option an argparse message is about ('--weight' -> 'weight')."""
    if message.startswith("unrecognized arguments"):
        return "argv"
    for word in message.replace("/", " ").replace(",", " ").split():
        word = word.strip("'\"():")
        if word.startswith("--"):
            return word[2:].replace("-", "_")
    return "command"


def _number(kind, field):
    """An argparse type that reports the field and the allowed values."""

    def convert(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                "--%s must be %s; got %r"
                % (field.replace("_", "-"), "an integer" if kind is int else "a number", text)
            ) from None
        if value < 0:
            raise argparse.ArgumentTypeError(
                "--%s must not be negative; got %r" % (field.replace("_", "-"), text)
            )
        return value

    return convert


def _add_common_options(parser, defaults):
    """--config and --pin-dir, accepted before or after the subcommand."""
    parser.add_argument(
        "--config",
        default=DEFAULT_CONFIG if defaults else argparse.SUPPRESS,
        help="node configuration written by the ebpf_router role (default %s)" % DEFAULT_CONFIG,
    )
    parser.add_argument(
        "--pin-dir",
        default=None if defaults else argparse.SUPPRESS,
        help="bpffs directory of the router's pins (default: pin_dir in --config, else %s)"
        % DEFAULT_PIN_DIR,
    )
    parser.add_argument(
        "--fence-file",
        default=None if defaults else argparse.SUPPRESS,
        help="where the node keeps its fence epoch (default: fence_file in --config, else %s); "
        "where --config is the router's (its pin_dir), any other file is refused"
        % DEFAULT_FENCE_FILE,
    )


def _add_epoch(parser, help_text):
    parser.add_argument("--epoch", type=_number(int, "epoch"), default=None, help=help_text)


def build_parser():
    parser = _Parser(
        prog="zerolayer-routectl",
        description="Change and read the node's sk_lookup router. Prints one JSON line.",
    )
    _add_common_options(parser, defaults=True)
    common = _Parser(add_help=False)
    _add_common_options(common, defaults=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    def add(name, help_text):
        return commands.add_parser(name, help=help_text, parents=[common])

    set_weight = add(
        "set-weight",
        "one atomic write of a route's weight (percent, 0-100) and, with it, its cohorts and hash",
    )
    set_weight.add_argument("--route", required=True)
    set_weight.add_argument(
        "--weight",
        default=None,
        help="percent, at most two decimals (required unless a cohort option or --hash is "
        "given; omitted: unchanged)",
    )
    set_weight.add_argument(
        "--always-direct",
        default=None,
        metavar="CIDR[,CIDR...]",
        help="the opt-in cohort: client networks sent to the engine at any weight (fenced "
        "like a weight raise; a rollback clears it with the weight); '' clears; omitted: "
        "unchanged",
    )
    set_weight.add_argument(
        "--never-direct",
        default=None,
        metavar="CIDR[,CIDR...]",
        help="the opt-out cohort: client networks left to the proxy at any weight; '' clears; "
        "omitted: unchanged",
    )
    set_weight.add_argument(
        "--hash",
        default=None,
        metavar="connection|client",
        help="what the split hashes: connection (the 4-tuple, each connection on its own) or "
        "client (the client's address alone: one path, and one engine socket, per client); "
        "omitted: unchanged",
    )
    _add_epoch(set_weight, WRITER_EPOCH_HELP)

    rollback = add("rollback", "raise the fence, then weight 0 on every route, read back")
    _add_epoch(rollback, FENCE_EPOCH_HELP)

    register = add("register", "put an engine's listening socket into a route's slot")
    register.add_argument("--route", required=True)
    register.add_argument("--slot", required=True, type=_number(int, "slot"))
    owner = register.add_mutually_exclusive_group(required=True)
    owner.add_argument("--pid", type=_number(int, "pid"))
    owner.add_argument("--unit")
    register.add_argument("--port", required=True, help="the engine's own listening port")
    register.add_argument(
        "--timeout",
        type=_number(float, "timeout"),
        default=None,
        help="seconds to wait for the engine to listen (default: register_timeout in "
        "--config, else %s)" % DEFAULT_REGISTER_TIMEOUT_S,
    )
    _add_epoch(register, WRITER_EPOCH_HELP)

    add(
        "show",
        "router state, routes, weights, hashes, slots, counters (client addresses per path for "
        "a route that hashes by client) and the fence epoch",
    )
    direct = add(
        "direct",
        "count each route's established direct-path connections (pooled clients the router "
        "handed to an engine), waiting up to --wait seconds for none to be left",
    )
    direct.add_argument(
        "--wait",
        type=_number(float, "wait"),
        default=0.0,
        help="seconds to wait for the engines to let them go (default 0: count once); the "
        "exit status is %d when some are left" % EXIT_SYSTEM,
    )
    detach = add(
        "detach",
        "deep rollback: raise the fence, keep the router detached (until attach --restore), "
        "detach the link and unpin program and maps",
    )
    _add_epoch(detach, FENCE_EPOCH_HELP)
    detach.add_argument(
        "--reason", default=None, help="why, kept with the detached mode (default: deep rollback)"
    )
    attach = add(
        "attach",
        "attach and declare routes and engines from --config (used at boot); a node a deep "
        "rollback keeps detached stays detached",
    )
    attach.add_argument(
        "--restore",
        action="store_true",
        help="leave the detached mode a deep rollback recorded and attach again",
    )
    attach.add_argument(
        "--keep-seeds",
        action="store_true",
        help="with --restore: use the hash seeds the deep rollback kept (the same paths)",
    )
    attach.add_argument(
        "--move-netns",
        action="store_true",
        help="allow moving the router's link out of the netns it is attached to",
    )
    watch = add(
        "watch",
        "keep a watch on the fleet's fence in the rollout store and roll this node back the "
        "moment it rises (runs until stopped; the zerolayer-fence-watcher unit)",
    )
    watch.add_argument(
        "--store-config",
        default=DEFAULT_STORE_CONFIG,
        help="the node's store client settings (default %s, written by the rollout_store "
        "role's node_client)" % DEFAULT_STORE_CONFIG,
    )
    watch.add_argument(
        "--status-file",
        default=DEFAULT_WATCH_STATUS,
        help="where the watcher says how it is (the route exporter reads it; default %s)"
        % DEFAULT_WATCH_STATUS,
    )
    watch.add_argument(
        "--once",
        action="store_true",
        help="read the fence, act on it and acknowledge, then exit (no watch)",
    )
    return parser


# Configuration


def load_config(path, required=False):
    """The node configuration as a dict; {} when it is absent and not required."""
    try:
        with open(path) as handle:
            config = json.load(handle)
    except FileNotFoundError:
        if required:
            raise UsageError(
                "config %s does not exist; the ebpf_router role writes it" % path, "config"
            ) from None
        return {}
    except (OSError, ValueError) as exc:
        raise UsageError("config %s cannot be read as JSON: %s" % (path, exc), "config") from None
    if not isinstance(config, dict):
        raise UsageError("config %s must hold a JSON object" % path, "config")
    return config


def _layout(args, config):
    """The router's layout: its fence file is the node's (pins.node_layout), a --fence-file
    that names another one is refused. A --config that does not exist is no node config."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import node_layout

    node_config = config if config or os.path.exists(args.config) else None
    return node_layout(args.pin_dir, args.fence_file, node_config, args.config)


def _route_summary(route):
    if route is None:
        return None
    return {
        "weight": _percent(route.weight_bp),
        "weight_bp": route.weight_bp,
        "generation": route.generation,
    }


def _percent(weight_bp):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        bp_to_percent,
    )

    return bp_to_percent(weight_bp)


# Subcommands


def cmd_set_weight(args, config):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import routes

    if (
        args.weight is None
        and args.always_direct is None
        and args.never_direct is None
        and args.hash is None
    ):
        raise UsageError(
            "set-weight: --weight is required unless --always-direct, --never-direct or --hash "
            "is given",
            "weight",
        )
    layout = _layout(args, config)
    routes.validate_route_name(args.route, "route")
    if args.weight is not None:
        routes.parse_weight(args.weight, "weight")
    if args.hash is not None:
        routes.parse_hash_mode(args.hash, "hash")
    always = _cidr_list(args.always_direct)
    never = _cidr_list(args.never_direct)
    routes.require_route(layout, args.route)
    result = routes.set_route(
        layout,
        args.route,
        weight=args.weight,
        epoch=args.epoch,
        always_direct=always,
        never_direct=never,
        hash_mode=args.hash,
    )
    confirmed = routes.find_route(routes.read_routes(layout), args.route)
    output = {
        "epoch": args.epoch,
        "route": args.route,
        "port": confirmed.port,
        "changed": result["changed"],
        "before": _route_summary(result["before"]),
        "after": _route_summary(confirmed),
        # What the node's fence could not check (the rollout store did not answer).
        "warnings": result["warnings"],
    }
    # The cohorts only when asked about: a plain weight write prints what it always did.
    if (always is not None or never is not None) and result.get("cohorts_after") is not None:
        output["before"].update(result["cohorts_before"] or {})
        output["after"].update(result["cohorts_after"])
        output["after"]["opt_in"] = confirmed.opt_in
    if args.hash is not None:
        output["before"]["hash"] = result["before"].hash_mode
        output["after"]["hash"] = confirmed.hash_mode
    return output


def _cidr_list(text):
    """A comma-separated list of CIDRs as a list ('' is the empty list); None stays None."""
    if text is None:
        return None
    return [item.strip() for item in text.split(",") if item.strip()]


def cmd_rollback(args, config):
    """Weight 0 on every route; the read-back proves it (fast-rollback primitive)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import routes
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import raise_fence
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_mode import (
        detached_without_maps,
    )

    started = time.monotonic()
    layout = _layout(args, config)
    if detached_without_maps(layout):
        # A deep rollback detached the router: nothing goes direct; the newer fence is kept.
        epoch_before, epoch_after = raise_fence(
            layout.fence_file, args.epoch, "fast rollback (router detached)"
        )
        return {
            "rolled_back": True,
            "router": "detached",
            "fence_epoch_before": epoch_before,
            "fence_epoch": epoch_after,
            "routes": [],
            "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3),
        }, EXIT_OK
    # The fence first: from here on no writer with an older epoch can raise a weight.
    epoch_before, epoch_after = routes.fence_routes(layout, args.epoch, "fast rollback")
    before = {route.name: route for route in routes.read_routes(layout)}
    # Blind writes, no lock: a rollback never waits behind another writer.
    failures, confirmed = routes.roll_back_and_read(layout, before)
    report = []
    for route in confirmed:
        entry = {
            "route": route.name,
            "port": route.port,
            "weight_before": _percent(before[route.name].weight_bp)
            if route.name in before
            else None,
            "weight": _percent(route.weight_bp),
            "generation": route.generation,
            # The same write clears the opt-in cohort (always_direct) with the weight.
            "opt_in": route.opt_in,
            "confirmed": route.weight_bp == 0 and not route.opt_in,
        }
        if route.name in failures:
            entry["error"] = failures[route.name]
        report.append(entry)
    all_confirmed = all(entry["confirmed"] for entry in report)
    return {
        "rolled_back": all_confirmed,
        "fence_epoch_before": epoch_before,
        "fence_epoch": epoch_after,
        "routes": report,
        "elapsed_ms": round((time.monotonic() - started) * 1000.0, 3),
    }, (EXIT_OK if all_confirmed else EXIT_SYSTEM)


def cmd_register(args, config):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
        engine_sockets,
        routes,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        validate_port,
        validate_slot,
    )

    layout = _layout(args, config)
    routes.validate_route_name(args.route, "route")
    validate_slot(args.slot)
    port = validate_port(args.port)
    pid = args.pid
    if pid is None:
        pid = engine_sockets.main_pid_of_unit(args.unit)
    timeout = args.timeout
    if timeout is None:
        timeout = float(config.get("register_timeout", DEFAULT_REGISTER_TIMEOUT_S))
    result = engine_sockets.register_engine_socket(
        layout, args.route, pid, port, slot=args.slot, timeout=timeout, epoch=args.epoch
    )
    return {
        "route": args.route,
        "slot": args.slot,
        "unit": args.unit,
        "pid": pid,
        "port": port,
        "changed": result["changed"],
        "cookie_before": result["before"],
        "cookie": result["cookie"],
        "route_index": result["route_index"],
        "warnings": result["warnings"],
    }


def cmd_show(args, config):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.report import router_report

    return router_report(_layout(args, config))


def _routes_by_name(layout, config):
    """{route name: service port}: the node config's routes and any the maps hold."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import routes
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import missing_pins

    by_name = {route["name"]: route["port"] for route in _config_routes(config)}
    if os.path.isdir(layout.pin_dir) and not missing_pins(layout):
        by_name.update((route.name, route.port) for route in routes.read_routes(layout))
    return by_name


def cmd_direct(args, config):
    """What is left of the direct path for pooled clients after a lowering (direct_drain)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import direct_drain

    if args.wait < 0:
        raise UsageError("wait must be seconds >= 0; got %s" % args.wait, "wait")
    layout = _layout(args, config)
    outcome = direct_drain.wait_until_drained(
        _routes_by_name(layout, config), args.wait, config.get("netns") or None
    )
    return outcome, (EXIT_OK if outcome["drained"] else EXIT_SYSTEM)


def cmd_detach(args, config):
    """The deep rollback, the same one as the router module's state=detached."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle

    layout = _layout(args, config)
    result = router_lifecycle.deep_rollback(layout, args.epoch, args.reason)
    return {
        "fence_epoch_before": result["fence"]["epoch_before"],
        "fence_epoch": result["fence"]["epoch"],
        "mode": result["mode"],
        "changed": result["changed"],
        "actions": result["actions"],
        "attached": result["after"]["attached"],
        "maps_pinned": result["after"]["maps_pinned"],
    }


def _config_routes(config):
    declared = config.get("routes", [])
    if not isinstance(declared, list):
        raise UsageError("config routes must be a list", "routes")
    for route in declared:
        if not isinstance(route, dict) or "name" not in route or "port" not in route:
            raise UsageError(
                "config routes: each entry needs name and port; got %r" % (route,), "routes"
            )
    return declared


def cmd_attach(args, config):
    """Attach the router, create missing routes, register running engines (boot path).

    A route that already exists keeps its live weight unless the config pins it
    (pin_weight): a restart must not undo a canary step. Engines that are not
    running yet are reported, not fatal: their own start hook registers them.
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
        engine_sockets,
        fence,
        router_lifecycle,
        routes,
    )

    config = config or load_config(args.config, required=True)
    layout = _layout(args, config)
    declared = _config_routes(config)
    attached = router_lifecycle.attach(
        layout,
        config.get("object", DEFAULT_OBJECT),
        config.get("netns", "/proc/self/ns/net"),
        restore=args.restore,
        move_netns=args.move_netns,
        keep_seeds=args.keep_seeds,
    )
    if attached["kept_detached"]:
        # Exit 0: the boot unit must not fail (or loop) on a node kept detached on purpose.
        from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_mode import (
            kept_detached_message,
        )

        return {
            "changed": False,
            "actions": [],
            "attached": False,
            "kept_detached": attached["kept_detached"],
            "message": kept_detached_message(attached["kept_detached"], layout.fence_file),
            "routes": [],
            "engines": [],
        }
    live = {route.name for route in routes.read_routes(layout)}
    route_results = []
    engine_results = []
    for route in declared:
        weight = route.get("weight", 0)
        keep_live = route["name"] in live and not route.get("pin_weight", False)
        entry = {"route": route["name"]}

        # A declared hash is written at every attach (boot, restore): a deep rollback removed
        # the routes with the maps, and the route must come back hashing as declared.
        def declare(weight_written, route=route):
            return routes.set_route(
                layout, route["name"], route["port"], weight_written, hash_mode=route.get("hash")
            )

        try:
            result = declare(None if keep_live else weight)
        except fence.FenceRefused as exc:
            # Boot carries no epoch: after a rollback a declared weight waits for a rollout,
            # the route itself is still created (at 0) or kept as it is.
            result = declare(0 if route["name"] not in live else None)
            entry["fenced"] = exc.message
        entry["changed"] = result["changed"]
        route_results.append(entry)
        for engine in route.get("engines", []):
            entry = {"route": route["name"], "slot": engine.get("slot", 0)}
            try:
                pid = engine.get("pid") or engine_sockets.main_pid_of_unit(engine["unit"])
                registered = engine_sockets.register_engine_socket(
                    layout,
                    route["name"],
                    int(pid),
                    engine["port"],
                    slot=engine.get("slot", 0),
                    timeout=ATTACH_REGISTER_TIMEOUT_S,
                )
                entry.update(registered=True, changed=registered["changed"])
            except FleetError as exc:
                entry.update(registered=False, error=exc.message)
            engine_results.append(entry)
    return {
        "changed": attached["changed"]
        or any(result["changed"] for result in route_results)
        or any(result.get("changed") for result in engine_results),
        "actions": attached["actions"],
        "attached": attached["after"]["attached"],
        "kept_detached": None,
        "routes": route_results,
        "engines": engine_results,
    }


def _store_from_config(path):
    """The rollout store as the node's store.json describes it (store/node_client.node_store:
    the one reader of it, which a writer checking its epoch uses too)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.store.node_client import (
        node_store,
    )

    return node_store(path)


def cmd_watch(args, config):
    """The fence watcher (fence_watcher.py); its last status is the one JSON line."""
    import signal

    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.fence_watcher import Watcher

    store, node = _store_from_config(args.store_config)

    def log(message):
        _emit(sys.stderr, {"watcher": message, "at_unix": round(time.time(), 3)})

    watcher = Watcher(store, _layout(args, config), node, args.status_file, log, config)
    if args.once:
        watcher.catch_up()
        return watcher.status
    stopping = []
    started_with = _read_bytes(args.store_config)

    def stop(signum, _frame):
        stopping.append(signum)
        raise _Stopped()

    def store_config_changed():
        # New endpoints or credentials (a run of the rollout_store role): end, so that the
        # unit starts the watcher again with them (Restart=always). Checked after each
        # store event and at least every idle re-check (10 s).
        return _read_bytes(args.store_config) != started_with

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        watcher.run(stop=lambda: bool(stopping) or store_config_changed())
    except _Stopped:
        pass
    watcher.status["stopped_by_signal"] = stopping[0] if stopping else None
    watcher.status["stopped_for"] = (
        "signal" if stopping else "store config %s changed" % args.store_config
    )
    return watcher.status


def _read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return None


class _Stopped(BaseException):
    """Raised from the signal handler: ends a watch blocked on the store's answer at once."""


_HANDLERS = {
    "set-weight": cmd_set_weight,
    "rollback": cmd_rollback,
    "register": cmd_register,
    "show": cmd_show,
    "direct": cmd_direct,
    "detach": cmd_detach,
    "attach": cmd_attach,
    "watch": cmd_watch,
}


# Entry points


def _emit(stream, payload):
    stream.write(json.dumps(payload, sort_keys=True) + "\n")
    stream.flush()


def run(argv, stdout=None, stderr=None):
    """Parse argv, run the subcommand, print one JSON line; return the exit status."""
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    try:
        args = build_parser().parse_args(argv)
        # attach reads the config itself and insists on it; the others only borrow pin_dir.
        config = {} if args.command == "attach" else load_config(args.config)
        outcome = _HANDLERS[args.command](args, config)
    except UsageError as exc:
        _emit(stderr, {"error": exc.message, "field": exc.field})
        return EXIT_REJECTED
    except Exception as exc:  # every failure must still be one JSON line
        details = getattr(exc, "details", None)
        if details is None:
            _emit(stderr, {"error": "%s: %s" % (type(exc).__name__, exc), "field": None})
            return EXIT_SYSTEM
        payload = {"error": exc.message, "field": details.get("field")}
        payload.update({k: v for k, v in details.items() if _is_json_scalar(v)})
        _emit(stderr, payload)
        return EXIT_REJECTED if payload["field"] else EXIT_SYSTEM
    status = EXIT_OK
    if isinstance(outcome, tuple):
        outcome, status = outcome
    _emit(stdout, outcome)
    return status


def _is_json_scalar(value):
    return value is None or isinstance(value, (str, int, float, bool, list))


def main(argv=None):
    return run(sys.argv[1:] if argv is None else argv)


def register_hook_main(argv=None):
    """The engine units' start hook: `<command> ROUTE SLOT PORT UNIT` (model_engine's order)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 4:
        _emit(
            sys.stderr,
            {
                "error": "usage: zerolayer-register-engine ROUTE SLOT PORT UNIT; got %d arguments"
                % len(argv),
                "field": "argv",
            },
        )
        return EXIT_REJECTED
    route, slot, port, unit = argv
    return run(["register", "--route", route, "--slot", slot, "--port", port, "--unit", unit])
