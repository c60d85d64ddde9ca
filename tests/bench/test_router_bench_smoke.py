"""A one-second run of the data-plane bench: the harness works, reports every row, cleans up.

It checks structure, request counts and where connections went; never speed (the
machine is shared, so speed belongs to the bench itself, not to a test).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "router_bench.py"

pytestmark = pytest.mark.dataplane


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.fail("the bench loads BPF programs and creates network namespaces: run as root")
    output_dir = tmp_path_factory.mktemp("bench-results")
    done = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--output-dir", str(output_dir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    json_files = list(output_dir.glob("*.json"))
    markdown_files = list(output_dir.glob("*.md"))
    assert len(json_files) == 1 and len(markdown_files) == 1, list(output_dir.iterdir())
    report = json.loads(json_files[0].read_text())
    return {"report": report, "markdown": markdown_files[0].read_text(), "stdout": done.stdout}


def test_every_case_and_mode_has_a_row_with_requests(quick_report):
    rows = quick_report["report"]["summary"]["rows"]
    assert {(row["case"], row["mode"]) for row in rows} == {
        (case, mode) for case in "abc" for mode in ("keepalive", "close")
    } | {("e", "close")}
    for row in rows:
        assert row["rounds"] == 1, row
        assert row["requests"] > 0, row
        assert row["rps_median"] > 0, row
        assert row["errors"] == 0, row
        assert 0 < row["p50_us"] <= row["p99_us"], row


def test_ratios_decision_times_and_targets_are_reported(quick_report):
    summary = quick_report["report"]["summary"]
    assert set(summary["ratios"]) == {"b/a keepalive", "b/a close", "b/c keepalive", "b/c close"}
    assert all(value > 0 for value in summary["ratios"].values())
    for key in ("b", "c"):
        decision = summary["decision"][key]
        assert decision["run_cnt"] > 0, decision
        assert decision["mean_ns"] > 0, decision
        assert decision["histogram_count"] > 0, decision
        assert decision["p50_ns"] <= decision["p99_ns"], decision
        assert decision["p99_ns"] / 2 <= decision["p99_interpolated_ns"] <= decision["p99_ns"]
    floor = summary["decision"]["e"]
    assert floor["run_cnt"] > 0 and floor["mean_ns"] > 0, floor
    assert summary["above_floor_ns"]["b"] == summary["decision"]["b"]["mean_ns"] - floor["mean_ns"]
    assert [target["name"] for target in summary["targets"]] == [
        "(b)/(a) req/s, keepalive, side by side",
        "(b)/(a) req/s, close, side by side",
        "(b)/(c) req/s, keepalive",
        "mean decision time (b)",
        "p99 decision time (b), interpolated in its bucket as histogram_quantile() does",
    ]
    # Each target judges the figure it names, and its verdict agrees with the bound it states.
    measured_of = {
        "(b)/(a) req/s, keepalive, side by side": summary["side_by_side"]["keepalive"]["median"],
        "(b)/(a) req/s, close, side by side": summary["side_by_side"]["close"]["median"],
        "(b)/(c) req/s, keepalive": summary["ratios"]["b/c keepalive"],
        "mean decision time (b)": summary["decision"]["b"]["mean_ns"],
        "p99 decision time (b), interpolated in its bucket as histogram_quantile() does": summary[
            "decision"
        ]["b"]["p99_interpolated_ns"],
    }
    for target in summary["targets"]:
        assert target["measured"] == measured_of[target["name"]], target
        assert target["measured"] > 0, target
        sense, bound = target["target"].split()[:2]
        within = {
            ">=": target["measured"] >= float(bound),
            "<=": target["measured"] <= float(bound),
        }
        assert target["passed"] is within[sense], target


def test_side_by_side_pairs_a_and_b_in_every_round_and_mode(quick_report):
    pairs = quick_report["report"]["side_by_side"]
    assert {(pair["round"], pair["mode"]) for pair in pairs} == {(1, "keepalive"), (1, "close")}
    for pair in pairs:
        assert pair["rps"]["a"] > 0 and pair["rps"]["b"] > 0, pair
        assert pair["errors"] == {"a": 0, "b": 0}, pair
    summary = quick_report["report"]["summary"]["side_by_side"]
    for mode in ("keepalive", "close"):
        (pair,) = [pair for pair in pairs if pair["mode"] == mode]
        assert summary[mode]["median"] == pair["rps"]["b"] / pair["rps"]["a"]


def test_test_runs_cover_both_weights_timed_and_not_and_the_floor(quick_report):
    rows = quick_report["report"]["test_runs"]["rows"]
    assert [(row["program"], row["decision"]) for row in rows] == [
        ("router, weight 100", "not timed"),
        ("router, weight 100", "timed"),
        ("router, weight 0", "not timed"),
        ("router, weight 0", "timed"),
        ("only returns SK_PASS", "-"),
    ]
    assert all(row["ns_per_run"] > 0 for row in rows), rows


def test_weight_100_routes_to_the_engine_and_weight_0_to_the_proxy(quick_report):
    decision = quick_report["report"]["summary"]["decision"]
    routed, proxied = decision["b"]["counters"], decision["c"]["counters"]
    assert routed["to_engine"] > 0 and routed["to_proxy_by_weight"] == 0, routed
    assert proxied["to_proxy_by_weight"] > 0 and proxied["to_engine"] == 0, proxied
    for counters in (routed, proxied):
        assert counters["fallback_no_socket"] == 0 and counters["assign_errors"] == 0, counters
    # Connection per request: every request of case b was one lookup handed to the engine.
    close_b = next(
        run
        for run in quick_report["report"]["runs"]
        if run["case"] == "b" and run["mode"] == "close"
    )
    assert close_b["router"]["counters"]["to_engine"] >= close_b["requests"]


def test_markdown_table_is_printed_and_written(quick_report):
    assert quick_report["report"]["markdown"] in quick_report["stdout"]
    tables = {}
    for block in quick_report["markdown"].split("\n\n"):
        lines = block.strip().splitlines()
        if lines and lines[0].startswith("| "):
            tables[lines[0].split("|")[1].strip()] = lines[2:]  # rows under the header
    assert {name: len(rows) for name, rows in tables.items()} == {
        "Case": 7,
        "Ratio of req/s": 4,
        "(b)/(a) req/s": 2,
        "Route decision": 3,
        "Program": 5,
        "Target": 5,
    }


def test_cohort_variants_include_the_route_that_hashes_by_client(quick_report):
    cohorts = quick_report["report"]["cohorts"]
    names = [variant["name"] for variant in cohorts["variants"]]
    assert names == ["0", "0lookup", "1", "200", "200in", "hashclient"]
    variants = cohorts["summary"]["variants"]
    test_rows = {row["variant"]: row for row in cohorts["test_runs"]["rows"]}
    for name in names:
        hashed = name == "hashclient"
        # The hash as the stored route entry says, in the traffic netns and the test runs.
        wanted = "client" if hashed else "connection"
        assert variants[name]["route"]["hash_mode"] == wanted, variants[name]["route"]
        assert test_rows[name]["hash_mode"] == wanted, test_rows[name]
        # Only the routes without cohorts skip the trie, 0lookup's entry rewritten without it.
        skips = name in ("0", "hashclient")
        assert variants[name]["route"]["skips_trie"] is skips, variants[name]["route"]
        assert test_rows[name]["skips_trie"] is skips, test_rows[name]
        # Only the route that hashes by client notes its one client (127.0.0.1, direct).
        noted = {"to_engine": 1, "to_proxy": 0} if hashed else {"to_engine": 0, "to_proxy": 0}
        assert variants[name]["route"]["clients_noted"] == noted
        assert test_rows[name]["clients_noted"] == noted
        traffic = variants[name]["traffic"]["counters"]
        assert traffic["to_engine"] > 0 and traffic["to_proxy_by_weight"] == 0, traffic
        assert traffic["fallback_no_socket"] == 0 and traffic["assign_errors"] == 0, traffic
        assert variants[name]["errors"] == 0
    judged = {(verdict["variant"], verdict["figure"]) for verdict in cohorts["summary"]["targets"]}
    assert {figure for variant, figure in judged if variant == "hashclient"} == {
        "above_none_ns",
        "traffic_above_none_ns",
        "p99_ns",
        "keepalive",
        "close",
    }
    assert "| hashclient | 0 / 0 | client |" in quick_report["markdown"]
    assert "| hashclient | client |" in quick_report["markdown"]


def test_new_clients_of_a_route_that_hashes_by_client_are_measured_and_noted(quick_report):
    new_clients = quick_report["report"]["cohorts"]["new_clients"]
    assert new_clients["hash_mode"] == "client" and new_clients["pairs"] == 200
    below, full = new_clients["phases"]["below_bound"], new_clients["phases"]["at_bound"]
    # Below the bound every new address is noted, direct (weight 100), beside the known one.
    assert below["addresses_before"] == 0
    assert below["noted_after"] == {"to_engine": 201, "to_proxy": 0}
    # Filled: the table holds at most its bound, the least recently seen ones evicted.
    assert full["addresses_before"] == new_clients["bound"] == 65536
    assert 0 < full["noted_after"]["to_engine"] <= new_clients["bound"]
    for figures in (below, full):
        assert figures["new_median_ns"] > 0 and figures["known_median_ns"] > 0
    assert "**New clients of a route that hashes by client**" in quick_report["markdown"]


def test_nothing_is_left_behind(quick_report):
    lab = quick_report["report"]["lab"]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    for name in lab["netns"]:
        assert name not in netns.stdout
    with open("/proc/mounts") as handle:
        assert lab["bpffs"] not in handle.read()
    workdir = os.path.dirname(lab["bpffs"])
    assert not os.path.exists(workdir)
    assert not processes_mentioning(workdir)


def processes_mentioning(text):
    """Pids whose command line contains text (nginx runs with -p <workdir>/...)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % entry, "rb") as handle:
                cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(int(entry))
    return found
