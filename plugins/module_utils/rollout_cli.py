# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""`zerolayer rollout ...`: the operator's command over the rollout store.

  zerolayer rollout status [ID] [-w] [-o json]
  zerolayer rollout pause ID [--wave W] [--reason TEXT]
  zerolayer rollout resume ID [--wave W]
  zerolayer rollout promote ID [--full] [--wave W]
  zerolayer rollout abort ID [--reason TEXT] [-i INVENTORY]
  zerolayer rollout history ID
  zerolayer rollout report ID [--png FILE] [--json]
  zerolayer rollout events ID
  zerolayer notifications show | set FILE | test

The store is named by --store-config (a JSON file: endpoints, ca_file, cert_file, key_file,
prefix), by $ZEROLAYER_STORE_CONFIG, or by --endpoints and the TLS options.

Exit status: 0 done; 2 bad input (unknown rollout or wave, a bad option: the message names
it and lists the known ones); 3 the store cannot be reached; 4 refused by the rollout's
state (promote on a finished rollout, resume of a fenced one); 5 abort raised the fence but
the push to the nodes failed; 1 anything else.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils import (
    notify,
    rollout_events,
    rollout_ops,
    rollout_timeline,
    stage_table,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.etcd_v3 import StoreUnavailable
from ansible_collections.zerolayer.fleet.plugins.module_utils.gates import (
    format_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.process_clock import (
    process_started_at,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_store import store_from_params

EXIT_OK, EXIT_OTHER, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_PUSH_FAILED = range(6)
OUTCOME_EXIT = {"bad_input": EXIT_BAD_INPUT, "refused": EXIT_REFUSED}
CONFIG_ENV = "ZEROLAYER_STORE_CONFIG"
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


def build_parser():
    parser = _Parser(prog="zerolayer", description="Operate rollouts through the rollout store.")
    parser.add_argument("--store-config", default=os.environ.get(CONFIG_ENV))
    parser.add_argument("--endpoints", action="append", default=[])
    parser.add_argument("--ca-file")
    parser.add_argument("--cert-file")
    parser.add_argument("--key-file")
    parser.add_argument("--user")
    parser.add_argument("--password-file")
    parser.add_argument("--prefix", default=None)
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    top = parser.add_subparsers(dest="noun", metavar="rollout", parser_class=_Parser)
    top.required = True
    noun = top.add_parser("rollout", help="status, pause, resume, promote, abort, history, report")
    verbs = noun.add_subparsers(dest="verb", metavar="ACTION", parser_class=_Parser)
    verbs.required = True

    status = verbs.add_parser("status", help="fence, owners, each wave and node")
    status.add_argument("rollout_id", nargs="?")
    status.add_argument("-w", "--watch", action="store_true", help="redraw until interrupted")
    status.add_argument("--interval", type=float, default=2.0)
    status.add_argument("--count", type=int, default=0, help="with -w: stop after N draws")
    for name in ("pause", "resume", "promote"):
        verb = verbs.add_parser(name)
        verb.add_argument("rollout_id")
        verb.add_argument("--wave")
        verb.add_argument("--reason", default="by request (zerolayer rollout %s)" % name)
        if name == "promote":
            verb.add_argument("--full", action="store_true", help="every wave to 100 %% now")
    abort = verbs.add_parser("abort", help="raise the fence, mark aborted, push weight 0")
    abort.add_argument("rollout_id")
    abort.add_argument("--reason", default="by request (zerolayer rollout abort)")
    abort.add_argument(
        "-i",
        "--inventory",
        action="append",
        default=[],
        help="push weight 0 to the nodes with rollback.yml (recommended); repeatable",
    )
    history = verbs.add_parser("history", help="who did what, when, why")
    history.add_argument("rollout_id")
    report = verbs.add_parser(
        "report", help="per wave and stage: weight, split, verdicts, time; --png: the timeline"
    )
    report.add_argument("rollout_id")
    report.add_argument("--png", metavar="FILE", help="also draw the rollout's timeline to FILE")
    # The same as -o json; SUPPRESS keeps a -o given before the noun when --json is absent.
    report.add_argument(
        "--json", dest="output", action="store_const", const="json", default=argparse.SUPPRESS
    )
    events = verbs.add_parser("events", help="the rollout's events, with the fleet's rollbacks")
    events.add_argument("rollout_id")

    sinks = top.add_parser("notifications", help="where rollout events are sent")
    sink_verbs = sinks.add_subparsers(dest="verb", metavar="ACTION", parser_class=_Parser)
    sink_verbs.required = True
    sink_verbs.add_parser("show", help="the sinks kept in the store (urls and headers hidden)")
    set_sinks = sink_verbs.add_parser(
        "set", help="replace the sinks with a JSON or YAML file's list"
    )
    set_sinks.add_argument("file")
    send_test = sink_verbs.add_parser("test", help="send one test event to every sink")
    send_test.add_argument("--wait", type=float, default=notify.DEFAULT_WAIT_S)
    return parser


def _store(args):
    params = {"endpoints": [], "prefix": None}
    if args.store_config:
        try:
            with open(args.store_config) as handle:
                params.update(json.load(handle))
        except (OSError, ValueError) as exc:
            raise FleetError(
                "store config %s cannot be read: %s" % (args.store_config, exc),
                {"field": "store_config", "outcome": "bad_input"},
            ) from None
    for option in ("ca_file", "cert_file", "key_file", "user", "password_file", "prefix"):
        if getattr(args, option):
            params[option] = getattr(args, option)
    if args.endpoints:
        params["endpoints"] = args.endpoints
    if not params["endpoints"]:
        raise FleetError(
            "no rollout store given: use --store-config FILE, $%s or --endpoints URL" % CONFIG_ENV,
            {"field": "endpoints", "outcome": "bad_input"},
        )
    return store_from_params(params)


def _actor():
    return "%s@%s" % (getpass.getuser(), socket.gethostname())


def _split_note(row, node):
    """(split 4.9%)" for a node whose split the current stage measured; OFF when outside."""
    split = (row.get("splits") or {}).get(node)
    if not split or split.get("measured_pct") is None:
        return ""
    return " (split %s%%%s)" % (split["measured_pct"], "" if split.get("ok") else " OFF")


def render_status(report):
    fence = report["fence"]
    lines = [
        "fence epoch %d%s"
        % (
            fence["epoch"],
            " (%s by %s at %s: %s)"
            % (fence.get("action"), fence.get("actor"), fence.get("at"), fence.get("reason"))
            if fence["epoch"]
            else "",
        )
    ]
    for scope, holder in sorted(report["owners"].items()):
        lines.append(
            "owner of %s: %s pid %s, rollout %s, since %s, lease %s s left"
            % (scope, holder.get("host"), holder.get("pid"), holder.get("rollout_id"),
               holder.get("since"), holder.get("ttl_left_s"))
        )  # fmt: skip
    header = "%-28s %-12s %-10s %-7s %7s %-9s %8s %-6s %s" % (
        "ROLLOUT", "WAVE", "OUTCOME", "STAGE", "WEIGHT", "VERDICT", "HOLD_S", "EPOCH", "NODES",
    )  # fmt: skip
    lines.append(header)
    for rollout_id, waves in sorted(report["rollouts"].items()):
        for wave, row in waves.items():
            nodes = ", ".join(
                "%s %s%%%s" % (node, entry.get("weight"), _split_note(row, node))
                for node, entry in sorted(row["nodes"].items())
            )
            lines.append(
                "%-28s %-12s %-10s %-7s %7s %-9s %8s %-6s %s"
                % (
                    rollout_id[:28],
                    wave[:12],
                    "fenced" if row["fenced"] else row["outcome"],
                    "%d/%d" % (row["stage_number"], row["stage_count"]),
                    row["weight"],
                    row["last_verdict"] or "-",
                    row["hold_remaining_s"],
                    row["fence_epoch_taken"] if row["fence_epoch_taken"] is not None else "-",
                    nodes or "-",
                )
            )
            if row["last_gates"]:
                lines.append(
                    "%-28s   gates: %s"
                    % ("", ", ".join("%s %s" % item for item in sorted(row["last_gates"].items())))
                )
    return "\n".join(lines)


def _push_abort(inventories, epoch, reason):
    """rollback.yml at the epoch abort raised (no preflight, no schedule); its exit status.
    Its output goes to stderr, so that stdout stays one JSON line with -o json."""
    argv = [
        shutil.which("ansible-playbook")
        or os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
    ]
    for inventory in inventories:
        argv += ["-i", inventory]
    argv += [
        os.path.join(REPO, "playbooks", "rollback.yml"),
        "-e", json.dumps({
            "rollback_fence_epoch": epoch,
            "rollback_reason": reason,
            # The abort's time runs from this command's start.
            "rollback_command_started_at": round(process_started_at(), 3),
        }),
    ]  # fmt: skip
    return subprocess.run(argv, check=False, stdout=sys.stderr, cwd=REPO).returncode


def _read_sink_file(path):
    import yaml  # a dependency of ansible-core, so always there beside this command

    try:
        with open(path) as handle:
            return yaml.safe_load(handle)
    except (OSError, yaml.YAMLError) as exc:
        raise FleetError("cannot read %s: %s" % (path, exc), {"field": "file"}) from None


def _sink_line(state):
    cursor = state["cursor"]
    line = "%-16s %-5s events=%s rollouts=%s delivered=%d failed=%d" % (
        state["name"],
        state["format"],
        ",".join(state["events"]),
        ",".join(state["rollouts"]),
        cursor["delivered"],
        cursor["failed"],
    )
    failure = cursor.get("last_failure")
    if failure:
        line += "; last failure: %s at %s: %s" % (
            failure["type"],
            failure.get("sent_at"),
            failure.get("error"),
        )
    return line


def _notifications(args, store):
    if args.verb == "set":
        sinks = notify.validate_sinks(_read_sink_file(args.file), "file %s" % args.file)
        notify.write_sinks(store, sinks)
    if args.verb in ("set", "show"):
        states = notify.sink_states(store)
        text = "\n".join(_sink_line(state) for state in states)
        _emit(args, {"notifications": states}, text or "no notification sinks are set")
        return EXIT_OK
    probe = rollout_events.event(
        "notification_test",
        None,
        format_timestamp(utc_now()),
        _actor(),
        reason="sent by zerolayer notifications test",
    )
    sent = notify.deliver([probe], notify.read_sinks(store), args.wait)
    _emit(
        args,
        sent,
        "delivered %d; failed: %s"
        % (
            sent["delivered"],
            "; ".join("%s: %s" % (f["sink"], f.get("error")) for f in sent["failed"]) or "none",
        ),
    )
    return EXIT_OK if not sent["failed"] else EXIT_OTHER


def _report(args, store):
    """report ID: the stage table (or with --json its rows and the timeline's series) from
    the store's records; --png FILE also draws the timeline. Changes nothing."""
    waves = rollout_ops.waves_of(store, args.rollout_id)
    now = time.time()
    rows = stage_table.rollout_rows(waves, now)
    series = rollout_timeline.timeline(waves, now)
    payload = {"rollout_id": args.rollout_id, "rows": rows, "timeline": series}
    lines = stage_table.render_table(rows)
    if args.png:
        title = rollout_timeline.picture_title(args.rollout_id, series)
        payload["png"] = rollout_timeline.draw_png(series, args.png, title)
        lines.append("picture: %s" % args.png)
    _emit(args, payload, "\n".join(lines))
    return EXIT_OK


def _emit(args, payload, text):
    if args.output == "json":
        sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(argv):
    args = build_parser().parse_args(argv)
    store = _store(args)
    verb = args.verb
    if verb == "status":
        draws = 0
        while True:
            report = rollout_ops.status(store, args.rollout_id)
            if args.watch and args.output == "table":
                sys.stdout.write("\x1b[2J\x1b[H")
            _emit(args, report, render_status(report))
            draws += 1
            if not args.watch or (args.count and draws >= args.count):
                return EXIT_OK
            time.sleep(args.interval)
    if verb == "report":
        return _report(args, store)
    if verb == "history":
        entries = rollout_ops.history(store, args.rollout_id)
        text = "\n".join(
            "%s  %-10s %-16s %-24s %s"
            % (e.get("at"), e["wave"], e["action"], e.get("by", ""), e.get("reason") or "")
            for e in entries
        )
        _emit(args, {"history": entries}, text)
        return EXIT_OK
    if args.noun == "notifications":
        return _notifications(args, store)
    if verb == "events":
        rollout_ops.waves_of(store, args.rollout_id)
        entries = rollout_events.list_events(store, args.rollout_id)
        text = "\n".join("%s  %s" % (e.get("at"), rollout_events.summary_line(e)) for e in entries)
        _emit(args, {"events": entries}, text)
        return EXIT_OK
    if verb == "abort":
        result = rollout_ops.abort(store, args.rollout_id, args.reason, _actor())
        status = EXIT_OK
        if args.inventory:
            result["push_rc"] = _push_abort(args.inventory, result["fence"]["epoch"], args.reason)
            status = EXIT_OK if result["push_rc"] == 0 else EXIT_PUSH_FAILED
        # Told after the act, by the fleet's sender: a slow receiver holds nothing up.
        result["notifications"] = notify.hand_off(store)
        _emit(
            args,
            result,
            "fence raised to epoch %d; waves: %s%s"
            % (
                result["fence"]["epoch"],
                ", ".join("%s %s" % (n, w["outcome"]) for n, w in sorted(result["waves"].items())),
                ""
                if args.inventory
                else "; push weight 0 with: ansible-playbook "
                "playbooks/rollback.yml -e rollback_fence_epoch=%d" % result["fence"]["epoch"],
            ),
        )
        return status
    if verb == "promote":
        done = rollout_ops.promote(
            store, args.rollout_id, args.reason, _actor(), full=args.full, wave=args.wave
        )
    else:
        done = getattr(rollout_ops, verb)(
            store, args.rollout_id, args.reason, _actor(), wave=args.wave
        )
    sent = notify.hand_off(store) if rollout_ops.events_of(done) else {"sender": "none needed"}
    _emit(
        args,
        {"action": verb, "waves": done, "notifications": sent},
        "%s: %s" % (verb, ", ".join("%s %s" % (n, w["outcome"]) for n, w in sorted(done.items()))),
    )
    return EXIT_OK


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        return run(argv)
    except UsageError as exc:
        sys.stderr.write("zerolayer: %s\n" % exc)
        return EXIT_BAD_INPUT
    except StoreUnavailable as exc:
        sys.stderr.write("zerolayer: %s\n" % exc.message)
        return EXIT_UNREACHABLE
    except FleetError as exc:
        sys.stderr.write("zerolayer: %s\n" % exc.message)
        return OUTCOME_EXIT.get(
            exc.details.get("outcome"), EXIT_BAD_INPUT if exc.details.get("field") else EXIT_OTHER
        )
    except KeyboardInterrupt:
        return EXIT_OK
