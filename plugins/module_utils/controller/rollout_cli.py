# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""`zerolayer rollout ...`: the operator's command over the rollout store.

  zerolayer rollout status [ID] [-w] [-o json]
  zerolayer rollout pause ID [--wave W] [--reason TEXT]
  zerolayer rollout resume ID [--wave W]
  zerolayer rollout promote ID [--full] [--wave W]
  zerolayer rollout abort ID [--reason TEXT] [-i INVENTORY]
  zerolayer rollout list [--limit N] [--since 7d]
  zerolayer rollout history ID
  zerolayer rollout report ID [--png FILE] [--json]
  zerolayer rollout events ID
  zerolayer notifications show | set FILE | test
  zerolayer rollback [--deep] [-i INVENTORY] [--hosts PATTERN] [--reason TEXT]

  zerolayer config
  zerolayer completion [bash]
  zerolayer --version

The store is found as store/store_settings.py says (--store-config, $ZEROLAYER_STORE_CONFIG, the
per-user file the store's play writes, the inventory); options go anywhere on the line.

Exit status: 0 done; 2 bad input (unknown rollout or wave, a bad option: the message names
it and lists the known ones); 3 the store cannot be reached; 4 refused by the rollout's
state (promote on a finished rollout, resume of a fenced one); 5 abort raised the fence but
a node was not confirmed (abort with -i, rollback); 1 anything else.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import socket
import sys
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_duration,
    parse_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.cohorts import (
    format_cohort,
    stage_cohort,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    FleetError,
    UsageError,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    process_started_at,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollback_command
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_artifact
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import (
    notify,
    rollout_timeline,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout_ops,
    stage_table,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import (
    rollout_events,
    store_settings,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
)

EXIT_OK, EXIT_OTHER, EXIT_BAD_INPUT, EXIT_UNREACHABLE, EXIT_REFUSED, EXIT_PUSH_FAILED = range(6)
OUTCOME_EXIT = {"bad_input": EXIT_BAD_INPUT, "refused": EXIT_REFUSED}
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


# Options every command takes, before or after the verb (`zerolayer rollout status ID -o
# json` as well as `zerolayer -o json rollout status ID`). Declared on every parser with no
# default, so that a parser that did not see an option never overwrites one another parser
# saw; GLOBAL_DEFAULTS fills in what nobody gave.
GLOBAL_DEFAULTS = {
    "store_config": None,
    "inventory": [],
    "endpoints": [],
    "ca_file": None,
    "cert_file": None,
    "key_file": None,
    "user": None,
    "password_file": None,
    "prefix": None,
    "output": "table",
}
EXAMPLES = """examples:
  zerolayer rollout status                  the fence, owners, rollouts in progress, nodes
  zerolayer rollout list --since 7d         every rollout, newest first, and how it ended
  zerolayer rollout status chat-v2 -o json  one rollout, as JSON
  zerolayer rollout pause chat-v2 --reason "p99 up on eu"
  zerolayer rollout abort chat-v2 -i inventories/prod   raise the fence, push weight 0
  zerolayer rollback -i inventories/prod    every node to the proxy now (--deep: router off)
  zerolayer config                          which store, found where (no secrets shown)
  eval "$(zerolayer completion)"            bash completion of nouns, verbs and options

The store is found through --store-config FILE, $ZEROLAYER_STORE_CONFIG, the per-user
file the store's play writes (~/.config/zerolayer/store.json), then -i INVENTORY or
ansible.cfg's inventory; --endpoints and the TLS options replace what was found.
Exit status: 0 done, 2 bad input, 3 store unreachable, 4 refused, 5 a node not confirmed,
1 other."""


def _global_options():
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("rollout store and output (anywhere on the line)")
    suppress = argparse.SUPPRESS
    group.add_argument(
        "--store-config",
        metavar="FILE",
        default=suppress,
        help="JSON settings: endpoints, ca_file, cert_file, key_file, user, password_file, prefix",
    )
    group.add_argument(
        "-i",
        "--inventory",
        action="append",
        metavar="INVENTORY",
        default=suppress,
        help="find the store in this inventory (repeatable); abort and rollback push to its nodes",
    )
    group.add_argument("--endpoints", action="append", metavar="URL", default=suppress)
    group.add_argument("--ca-file", default=suppress)
    group.add_argument("--cert-file", default=suppress)
    group.add_argument("--key-file", default=suppress)
    group.add_argument("--user", default=suppress)
    group.add_argument("--password-file", default=suppress)
    group.add_argument("--prefix", default=suppress)
    group.add_argument("-o", "--output", choices=["table", "json"], default=suppress)
    return common


def build_parser():
    common = _global_options()
    parser = _Parser(
        prog="zerolayer",
        description="Operate rollouts through the rollout store.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    parser.add_argument("--version", action="version", version="zerolayer %s" % _version())
    top = parser.add_subparsers(dest="noun",
                                metavar="{rollout,rollback,notifications,config,completion}",
                                parser_class=_Parser)  # fmt: skip
    top.required = True

    def command(subparsers, name, **kwargs):
        return subparsers.add_parser(name, parents=[common], **kwargs)

    noun = top.add_parser(
        "rollout", help="status, list, pause, resume, promote, abort, history, report, events"
    )
    verbs = noun.add_subparsers(dest="verb", metavar="ACTION", parser_class=_Parser)
    verbs.required = True

    status = command(verbs, "status", help="fence, owners, each wave and node")
    status.add_argument("rollout_id", nargs="?")
    status.add_argument("-w", "--watch", action="store_true", help="redraw until interrupted")
    status.add_argument("--interval", type=float, default=2.0)
    status.add_argument("--count", type=int, default=0, help="with -w: stop after N draws")
    for name in ("pause", "resume", "promote"):
        verb = command(verbs, name)
        verb.add_argument("rollout_id")
        verb.add_argument("--wave")
        verb.add_argument("--reason", default="by request (zerolayer rollout %s)" % name)
        if name == "promote":
            verb.add_argument("--full", action="store_true", help="every wave to 100 %% now")
    abort = command(verbs, "abort", help="raise the fence, mark aborted, push weight 0 (-i)")
    abort.add_argument("rollout_id")
    abort.add_argument("--reason", default="by request (zerolayer rollout abort)")
    listing = command(verbs, "list", help="every rollout, newest first, with how it ended")
    listing.add_argument("--limit", type=int, default=20, help="at most this many (20)")
    listing.add_argument("--since", help="created since: 30m, 6h, 7d or an ISO 8601 time")
    history = command(verbs, "history", help="who did what, when, why")
    history.add_argument("rollout_id")
    report = command(
        verbs, "report", help="per wave and stage: weight, split, verdicts, time; --png: timeline"
    )
    report.add_argument("rollout_id")
    report.add_argument("--png", metavar="FILE", help="also draw the rollout's timeline to FILE")
    # The same as -o json; SUPPRESS keeps a -o given elsewhere when --json is absent.
    report.add_argument(
        "--json", dest="output", action="store_const", const="json", default=argparse.SUPPRESS
    )
    events = command(verbs, "events", help="the rollout's events, with the fleet's rollbacks")
    events.add_argument("rollout_id")

    rollback = command(
        top, "rollback", help="every node back to the proxy now: weight 0 (--deep: router removed)"
    )
    rollback.add_argument("--deep", action="store_true", help="detach the router, proxy checked")
    rollback.add_argument("--hosts", default="gpu_nodes", help="inventory pattern (gpu_nodes)")
    rollback.add_argument("--reason", default="by request (zerolayer rollback)")
    rollback.add_argument(
        "--ack-wait", type=float, metavar="S",
        help="wait at most S s for the watchers (fast 2, deep 10; 0: push every node)",
    )  # fmt: skip
    rollback.add_argument(
        "--rollout-id", help="also mark this rollout's records rolled back, whatever their state"
    )
    rollback.add_argument("--report", metavar="FILE", help="where the JSON report goes")

    sinks = top.add_parser("notifications", help="where rollout events are sent")
    sink_verbs = sinks.add_subparsers(dest="verb", metavar="ACTION", parser_class=_Parser)
    sink_verbs.required = True
    command(sink_verbs, "show", help="the sinks kept in the store (urls and headers hidden)")
    set_sinks = command(sink_verbs, "set", help="replace the sinks with a JSON or YAML file's list")
    set_sinks.add_argument("file")
    send_test = command(sink_verbs, "test", help="send one test event to every sink")
    send_test.add_argument("--wait", type=float, default=notify.DEFAULT_WAIT_S)

    command(top, "config", help="which rollout store, found where (secrets hidden)")
    completion = top.add_parser(
        "completion", help='print the shell completion (bash): eval "$(zerolayer completion)"'
    )
    completion.add_argument("shell", nargs="?", choices=["bash"], default="bash")
    return parser


def _subcommands(parser):
    """{name: parser} of parser's subcommands."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def bash_completion(parser):
    """A bash completion for the command, made from its parser: nouns, verbs, options (the
    word after an option that takes a value is not taken for a noun or verb)."""
    options, valued = set(), set()
    levels = {"": sorted(_subcommands(parser))}
    for noun, noun_parser in _subcommands(parser).items():
        verbs = _subcommands(noun_parser)
        levels[noun] = sorted(verbs)
        for sub in [parser, noun_parser, *verbs.values()]:
            for action in sub._actions:
                options.update(action.option_strings)
                if action.option_strings and action.nargs != 0:
                    valued.update(action.option_strings)
    cases = "\n".join(
        '    "%s") COMPREPLY=($(compgen -W "%s" -- "$cur")) ;;' % (noun, " ".join(words))
        for noun, words in sorted(levels.items())
        if words
    )
    return """_zerolayer() {
  local cur=${COMP_WORDS[COMP_CWORD]} words=() skip= w
  for w in "${COMP_WORDS[@]:1:COMP_CWORD-1}"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case " %(valued)s " in *" $w "*) skip=1; continue ;; esac
    case "$w" in -*) ;; *) words+=("$w") ;; esac
  done
  case "$cur" in -*) COMPREPLY=($(compgen -W "%(options)s" -- "$cur")); return ;; esac
  [ "${#words[@]}" -le 1 ] || return
  case "${words[0]}" in
%(cases)s
  esac
}
complete -F _zerolayer zerolayer
""" % {"valued": " ".join(sorted(valued)), "options": " ".join(sorted(options)), "cases": cases}


def parse_args(argv):
    args = build_parser().parse_args(argv)
    for name, default in GLOBAL_DEFAULTS.items():
        if not hasattr(args, name):
            setattr(args, name, list(default) if isinstance(default, list) else default)
    if args.noun in ("config", "completion"):
        args.verb = None
    return args


def _version():
    try:
        return node_artifact.collection_version(REPO)
    except (OSError, ValueError, KeyError, FleetError):
        return "unknown"


def _store_settings(args):
    return store_settings.find(
        args.store_config,
        args.inventory,
        {key: getattr(args, key) for key in store_settings.KEYS},
        os.environ,
        os.path.join(REPO, "playbooks"),
    )


def _actor():
    return "%s@%s" % (getpass.getuser(), socket.gethostname())


def _split_note(row, node):
    """(split 4.9%)" for a node whose split the current stage measured; OFF when outside.
    At a cohort stage: " (opt-in 412 conn.)", the cohort's connections handed to an engine,
    with the connections the weight sent direct where there were any (there must be none)."""
    split = (row.get("splits") or {}).get(node)
    if split and split.get("cohort"):
        by_weight = int(split.get("to_engine") or 0)
        return " (%s%s%s)" % (
            stage_table.format_opt_in(split.get("opt_in")),
            ", %d by weight" % by_weight if by_weight else "",
            "" if split.get("ok") else " OFF",
        )
    if not split or split.get("measured_pct") is None:
        return ""
    return " (split %s%%%s)" % (split["measured_pct"], "" if split.get("ok") else " OFF")


def _weight_cell(row):
    """The WEIGHT column (status and list): the stage's percent, or 'cohort' at a cohort
    stage (weight 0)."""
    return "cohort" if row.get("cohort") else row["weight"]


def _cohort_lines(row):
    """Under a wave whose schedule has a cohort stage: the cohort stage it is at, and the
    schedule with its cohort stage."""
    lines = []
    cohort = row.get("cohort")
    if cohort:
        lines.append(
            "stage %s/%s %s at weight %s"
            % (
                row["stage_number"],
                row["stage_count"],
                format_cohort(cohort, listed=True),
                row["weight"],
            )
        )
    schedule = row.get("schedule") or []
    if any(stage_cohort(planned) for planned in schedule):
        lines.append("schedule: %s" % stage_table.format_schedule(schedule))
    return lines


def _percents(weights_bp):
    """'5%' or '5%/0%': the distinct weights of a node's routes, as percent."""
    values = sorted({weight / 100.0 for weight in weights_bp.values()})
    return "/".join("%g%%" % value for value in values) or "-"


def _live_note(row, node):
    """' now 5%' (what the node's watcher read), ' now 0% DIFFERS' where that is not what the
    record says the node should have, ' now unknown (no watcher)' where nothing is read."""
    live = (row.get("live") or {}).get(node)
    if live is None:
        return ""
    if live["weights_bp"] is None:
        return " now unknown (no watcher)"
    return " now %s%s" % (_percents(live["weights_bp"]), " DIFFERS" if live["differs"] else "")


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
    header = "%-28s %-12s %-11s %-7s %7s %-9s %8s %-6s %s" % (
        "ROLLOUT", "WAVE", "OUTCOME", "STAGE", "WEIGHT", "VERDICT", "HOLD_S", "EPOCH", "NODES",
    )  # fmt: skip
    lines.append(header)
    for rollout_id, waves in sorted(report["rollouts"].items()):
        for wave, row in waves.items():
            nodes = ", ".join(
                "%s %s%%%s%s"
                % (node, entry.get("weight"), _split_note(row, node), _live_note(row, node))
                for node, entry in sorted(row["nodes"].items())
            )
            lines.append(
                "%-28s %-12s %-11s %-7s %7s %-9s %8s %-6s %s"
                % (
                    rollout_id[:28],
                    wave[:12],
                    _outcome_word(row),
                    "%d/%d" % (row["stage_number"], row["stage_count"]),
                    _weight_cell(row),
                    row["last_verdict"] or "-",
                    row["hold_remaining_s"],
                    row["fence_epoch_taken"] if row["fence_epoch_taken"] is not None else "-",
                    nodes or "-",
                )
            )
            for line in _cohort_lines(row):
                lines.append("%-28s   %s" % ("", line))
            if row["progress"]["stuck"]:
                lines.append("%-28s   %s" % ("", _stuck_line(row["progress"])))
            if row["rolled_back_by"]:
                lines.append("%-28s   %s" % ("", _rolled_back_line(row["rolled_back_by"])))
                after = row.get("nodes_after_rollback") or {}
                if after:
                    lines.append("%-28s   nodes since: %s" % ("", _nodes_since(after)))
            if row["last_gates"]:
                lines.append(
                    "%-28s   gates: %s"
                    % ("", ", ".join("%s %s" % item for item in sorted(row["last_gates"].items())))
                )
    if report.get("finished_rollouts"):
        lines.append(
            "%d finished rollout(s) not shown: zerolayer rollout list" % report["finished_rollouts"]
        )
    return "\n".join(lines)


def _outcome_word(row):
    if row["fenced"]:
        return "fenced"
    if row["progress"]["stuck"]:
        return "STUCK"
    if row.get("rolled_back_by"):
        return "rolled back"
    return row["outcome"]


def _stuck_line(progress):
    return "stuck: no progress since %s (%ds, deadline %ds) and no runner owns it; %s" % (
        progress["last_progress_at"],
        progress["idle_s"],
        progress["deadline_s"],
        "its record asks the store's exporter to abort it"
        if progress["abort"]
        else "resume it (canary.yml) or abort it (zerolayer rollout abort)",
    )


def _rolled_back_line(fence):
    return "rolled back at epoch %s by %s, at %s (%s: %s)" % (
        fence.get("epoch"),
        fence.get("actor"),
        fence.get("at"),
        fence.get("action"),
        fence.get("reason"),
    )


def _nodes_since(after):
    """'n1 weights 0 (epoch 3), n2 not confirmed': what each node's watcher read back."""
    shown = []
    for node, seen in sorted(after.items()):
        if not seen["confirmed"]:
            shown.append("%s not confirmed" % node)
            continue
        shown.append(
            "%s %s (epoch %s)" % (node, _percents(seen.get("weights_bp") or {}), seen["epoch"])
        )
    return ", ".join(shown)


def render_list(listing):
    lines = [
        "%-28s %-12s %7s %-6s %-20s %s"
        % ("ROLLOUT", "STANDING", "WEIGHT", "EPOCH", "CREATED", "WAVES")
    ]
    for row in listing["rollouts"]:
        lines.append(
            "%-28s %-12s %7s %-6s %-20s %s"
            % (
                row["rollout_id"][:28],
                row["standing"],
                _weight_cell(row),
                "-" if row["fence_epoch_taken"] is None else row["fence_epoch_taken"],
                _to_the_second(row["created_at"]),
                ", ".join("%s %s" % item for item in sorted(row["waves"].items())),
            )
        )
        if row["rolled_back_by"]:
            lines.append("%-28s %s" % ("", _rolled_back_line(row["rolled_back_by"])))
    shown, total = len(listing["rollouts"]), listing["total"]
    if shown < total:
        lines.append("%d of %d shown (--limit)" % (shown, total))
    return "\n".join(lines)


def _to_the_second(timestamp):
    """'2026-12-05T07:16:12Z' of '2026-12-05T07:16:12.533506Z': a column, not a log line."""
    if not timestamp:
        return "-"
    whole, dot, _fraction = timestamp.partition(".")
    return whole + "Z" if dot else timestamp


def parse_since(value, now=None):
    """--since: a duration back from now (30m, 6h, 7d, as a schedule's holds are written) or
    a moment (ISO 8601, or Unix seconds when all digits)."""
    now = now or utc_now()
    text = (value or "").strip()
    if text and not text.isdigit():
        try:
            return now - datetime.timedelta(seconds=parse_duration(text, "since"))
        except FleetError:
            pass  # not a duration: perhaps a moment
    try:
        return parse_timestamp(text, "since")
    except FleetError:
        raise UsageError(
            "--since must be a duration (30m, 6h, 7d) or an ISO 8601 time such as "
            "2026-12-01T12:00:00Z; got %r" % value
        ) from None


def _roll_back_nodes(args, settings, epoch, mode, pattern, rollout_id=None):
    """The rollback of the inventory's nodes, in this process (rollback_command): the fence
    raised here (epoch None) or the one an abort raised counted, the nodes that did not
    confirm pushed, then the report written and the records and the event stored. Returns
    the report, with the command's time to this point (command_s)."""
    started_at = process_started_at()
    # Controller code (ansible-core's inventory), loaded only by the commands that name nodes.
    from ansible_collections.zerolayer.fleet.plugins.plugin_utils.inventory_hosts import (
        inventory_nodes,
    )

    nodes = inventory_nodes(args.inventory, pattern)
    actor = _actor()
    result = rollback_command.roll_back(
        settings, nodes, mode, args.reason, actor, args.inventory, started_at,
        ack_wait_s=getattr(args, "ack_wait", None), epoch=epoch,
    )  # fmt: skip
    # The person's wait ends with the last confirmation; what follows only reports.
    result["report_file"] = rollback_command.write_report(
        result, getattr(args, "report", None) or rollback_command.default_report_path(mode)
    )
    result["records"] = rollback_command.record_after(
        settings, result, actor, rollout_id, rollback_command.default_report_dir()
    )
    result["command_s"] = round(time.time() - started_at, 3)
    return result


def _push_abort(args, settings, epoch):
    """An abort's rollback of the -i inventories' gpu_nodes at the epoch it raised (None:
    the store could not be written, each node fences itself one above its own)."""
    return _roll_back_nodes(args, settings, epoch, "fast", "gpu_nodes", args.rollout_id)


def _confirmed_exit(report):
    return EXIT_OK if report["nodes_confirmed"] == report["nodes_total"] else EXIT_PUSH_FAILED


def _abort_without_store(args, exc):
    """An abort whose store could not be written (unreachable, no leader, no space, a login
    refused): the nodes come first. Every node is pushed and raises its own fence one above
    its epoch; the rollout's records are not marked (nothing could write them), and the
    next canary start brings the store up to the nodes' epoch, which fences them."""
    rolled = _push_abort(args, {}, None)
    result = {"store_error": exc.message, "fence": None, "waves": {}, "rollback": rolled}
    _emit(
        args,
        result,
        "the store was not updated (%s); every node was pushed weight 0 with its own fence: "
        "%s" % (exc.message, rollback_command.summary_line(rolled)),
    )
    return _confirmed_exit(rolled)


def _rollback(args):
    """`zerolayer rollback`: a store that cannot be found or read does not stop it."""
    try:
        settings = _store_settings(args)[0]
    except FleetError as exc:
        if exc.details.get("field") != "store_config":
            raise
        settings = {}
    result = _roll_back_nodes(
        args, settings, None, "deep" if args.deep else "fast", args.hosts, args.rollout_id
    )
    line = rollback_command.summary_line(result)
    _emit(args, result, "%s; the command took %.2f s" % (line, result["command_s"]))
    return _confirmed_exit(result)


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


def redraw(shown, lines):
    """What a terminal is sent to show lines where it shows `shown` (None: nothing yet):
    the whole screen the first time, then only the lines that changed, each rewritten in
    place (a watch over a slow link or a screen reader hears the change, not the page)."""
    if shown is None:
        return "\x1b[2J\x1b[H" + "\n".join(lines) + "\n"
    out = []
    for row, line in enumerate(lines):
        if row >= len(shown) or shown[row] != line:
            out.append("\x1b[%d;1H\x1b[2K%s" % (row + 1, line))
    if len(lines) < len(shown):
        out.append("\x1b[%d;1H\x1b[J" % (len(lines) + 1))
    out.append("\x1b[%d;1H" % (len(lines) + 1))
    return "".join(out)


def _emit(args, payload, text):
    if args.output == "json":
        sys.stdout.write(json.dumps(payload, sort_keys=True) + "\n")
    else:
        sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run(argv):
    args = parse_args(argv)
    if args.noun == "completion":
        sys.stdout.write(bash_completion(build_parser()))
        return EXIT_OK
    if args.noun == "config":
        settings, source = _store_settings(args)
        described = store_settings.describe(settings, source)
        _emit(
            args,
            described,
            "\n".join(
                ["source: %s" % source]
                + ["%s: %s" % item for item in sorted(described["settings"].items())]
            ),
        )
        return EXIT_OK
    if args.noun == "rollback":
        return _rollback(args)
    settings = _store_settings(args)[0]
    store = store_from_params(settings)
    verb = args.verb
    if verb == "status":
        draws, shown = 0, None
        while True:
            report = rollout_ops.status(store, args.rollout_id)
            if args.watch and args.output == "table":
                lines = render_status(report).split("\n")
                sys.stdout.write(redraw(shown, lines))
                sys.stdout.flush()
                shown = lines
            else:
                _emit(args, report, render_status(report))
            draws += 1
            if not args.watch or (args.count and draws >= args.count):
                return EXIT_OK
            time.sleep(args.interval)
    if verb == "list":
        if args.limit < 1:
            raise UsageError("--limit must be a whole number from 1; got %d" % args.limit)
        since = parse_since(args.since) if args.since else None
        listing = rollout_ops.rollouts(store, limit=args.limit, since=since)
        _emit(args, listing, render_list(listing))
        return EXIT_OK
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
        try:
            result = rollout_ops.abort(store, args.rollout_id, args.reason, _actor())
        except FleetError as exc:
            if not args.inventory or exc.details.get("outcome") in ("bad_input", "refused"):
                raise
            return _abort_without_store(args, exc)
        status = EXIT_OK
        if args.inventory:
            result["rollback"] = _push_abort(args, settings, result["fence"]["epoch"])
            status = _confirmed_exit(result["rollback"])
        # Told after the act, by the fleet's sender: a slow receiver holds nothing up.
        result["notifications"] = notify.hand_off(store)
        _emit(
            args,
            result,
            "fence raised to epoch %d; waves: %s%s"
            % (
                result["fence"]["epoch"],
                ", ".join("%s %s" % (n, w["outcome"]) for n, w in sorted(result["waves"].items())),
                "; " + rollback_command.summary_line(result["rollback"])
                if args.inventory
                else "; push weight 0 with: zerolayer rollback -i INVENTORY (or ansible-playbook "
                "playbooks/rollback.yml -e rollback_fence_epoch=%d)" % result["fence"]["epoch"],
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
