"""Engine slices' memory pressure: the PSI file, systemd's root, the tree of slices (no kernel)."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import engine_pressure as ep

# As a 6.x kernel writes an engine slice's memory.pressure.
BOTH = (
    "some avg10=1.39 avg60=0.38 avg300=0.08 total=331037\n"
    "full avg10=0.51 avg60=0.12 avg300=0.02 total=105491\n"
)
# Pressure files of kernels before 5.13 may have no "full" line.
SOME_ONLY = "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
HOST = "0::/system.slice/zerolayer-route-exporter.service\n"
CONTAINER = (
    "9:name=systemd:/libpod_parent/libpod-83eb/system.slice/zerolayer-route-exporter.service\n"
    "4:memory:/libpod_parent/libpod-83eb\n"
    "0::/libpod_parent/libpod-83eb/system.slice/zerolayer-route-exporter.service\n"
)


def test_both_kinds_in_ratios_and_seconds():
    assert ep.parse_pressure(BOTH) == {
        "some": {"avg10": pytest.approx(0.0139), "total": pytest.approx(0.331037)},
        "full": {"avg10": pytest.approx(0.0051), "total": pytest.approx(0.105491)},
    }


def test_a_file_without_full_gives_some_only():
    assert ep.parse_pressure(SOME_ONLY) == {"some": {"avg10": 0.0, "total": 0.0}}


def test_a_kind_this_code_does_not_know_is_skipped():
    text = BOTH + "partial avg10=9.00 total=1\n"
    assert set(ep.parse_pressure(text)) == {"some", "full"}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "has no 'some' line"),
        ("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", "has no 'some' line"),
        ("some avg10=0.00 avg60=0.00 avg300=0.00\n", "has no avg10=<percent> and total"),
        ("some avg10=abc total=1\n", "has no avg10=<percent> and total"),
        ("some avg10=0.5 total=1.5\n", "has no avg10=<percent> and total"),
        ("some avg10=101.00 total=1\n", "out of range"),
        ("some avg10=nan total=1\n", "out of range"),
        ("some avg10=0.00 total=-1\n", "out of range"),
    ],
    ids=[
        "empty",
        "no-some",
        "no-total",
        "not-a-number",
        "total-not-integer",
        "over-100",
        "nan",
        "negative-total",
    ],
)
def test_a_file_not_understood_names_the_path_and_why(text, says):
    with pytest.raises(ValueError, match=r"^/x/memory\.pressure") as error:
        ep.parse_pressure(text, "/x/memory.pressure")
    assert says in str(error.value)


@pytest.mark.parametrize(
    ("text", "root"),
    [
        (HOST, "/"),
        (CONTAINER, "/libpod_parent/libpod-83eb"),
        # A unit in a nested slice, systemd in a container under a host's systemd.
        (
            "0::/machine.slice/libpod-1.scope/a.slice/a-b.slice/x.service\n",
            "/machine.slice/libpod-1.scope",
        ),
        ("0::/\n", "/"),
    ],
    ids=["host", "container", "nested", "root"],
)
def test_systemd_root_is_the_own_cgroup_less_unit_and_slices(text, root):
    assert ep.systemd_root(text) == root


def test_a_v1_only_host_has_no_root():
    assert ep.systemd_root("4:memory:/system.slice/x.service\n") is None


def cgroup_tree(tmp_path, slices, unified="unified", own=CONTAINER):
    """A cgroup2 mount at tmp_path/<unified> and /proc/self/cgroup for a containerised
    exporter; slices: {directory name: memory.pressure text, or None for no file}."""
    mount = tmp_path / unified
    mount.mkdir()
    (mount / "cgroup.controllers").write_text("")
    engines = mount.joinpath("libpod_parent", "libpod-83eb", *ep.ENGINES_SLICE)
    engines.mkdir(parents=True)
    for name, text in slices.items():
        (engines / name).mkdir()
        if text is not None:
            (engines / name / "memory.pressure").write_text(text)
    own_cgroup = tmp_path / "self-cgroup"
    own_cgroup.write_text(own)
    # A hybrid host: /sys/fs/cgroup is a tmpfs, cgroup2 is mounted under it.
    return {"mounts": (str(tmp_path / "tmpfs"), str(mount)), "own_cgroup": str(own_cgroup)}


def test_every_engine_slice_is_read_and_nothing_else(tmp_path):
    where = cgroup_tree(
        tmp_path,
        {
            "zerolayer-engine-chat.slice": BOTH,
            "zerolayer-engine-embed.slice": SOME_ONLY,
            # Not an engine's slice: a unit put straight into the parent slice.
            "stray.service": BOTH,
        },
    )
    found = ep.read_engines(**where)
    assert found["error"] is None
    assert [engine["engine"] for engine in found["engines"]] == ["chat", "embed"]
    assert found["engines"][0]["pressure"]["some"]["total"] == pytest.approx(0.331037)
    assert set(found["engines"][1]["pressure"]) == {"some"}


def test_an_unreadable_engine_is_reported_and_the_others_are_read(tmp_path):
    where = cgroup_tree(
        tmp_path,
        {
            "zerolayer-engine-chat.slice": BOTH,
            "zerolayer-engine-batch.slice": None,  # PSI off: the file is not there
            "zerolayer-engine-embed.slice": "some avg10=x\n",
        },
    )
    found = ep.read_engines(**where)
    by_name = {engine["engine"]: engine for engine in found["engines"]}
    assert "pressure" in by_name["chat"]
    assert "does not exist (PSI off" in by_name["batch"]["error"]
    assert "has no avg10" in by_name["embed"]["error"]
    assert found["error"] == "; ".join([by_name["batch"]["error"], by_name["embed"]["error"]])


def test_a_node_without_engines_has_none_and_no_error(tmp_path):
    where = cgroup_tree(tmp_path, {})
    engines = tmp_path.joinpath("unified", "libpod_parent", "libpod-83eb", *ep.ENGINES_SLICE)
    engines.rmdir()
    assert ep.read_engines(**where) == {"engines": [], "error": None}


def test_a_unified_host_is_read_at_its_cgroup_mount(tmp_path):
    where = cgroup_tree(tmp_path, {"zerolayer-engine-chat.slice": BOTH}, unified="cgroup")
    where["mounts"] = (str(tmp_path / "cgroup"), str(tmp_path / "unified"))
    assert [e["engine"] for e in ep.read_engines(**where)["engines"]] == ["chat"]


def test_no_cgroup2_says_so(tmp_path):
    found = ep.read_engines(mounts=(str(tmp_path / "a"), str(tmp_path / "b")))
    assert found["engines"] == []
    assert found["error"].startswith("no cgroup2 hierarchy at %s or " % (tmp_path / "a"))


def test_a_v1_only_cgroup_file_says_so(tmp_path):
    where = cgroup_tree(tmp_path, {}, own="4:memory:/\n")
    found = ep.read_engines(**where)
    assert found == {"engines": [], "error": "%s has no unified (0::) line" % where["own_cgroup"]}


def test_a_slice_gone_while_read_is_left_out(tmp_path):
    # The engine stopped between the listing and the read: not an error, not an engine.
    assert ep.read_engine(str(tmp_path / "zerolayer-engine-chat.slice"), "chat") is None
