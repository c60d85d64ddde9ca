"""bench/decision_cost.py's cohort variants: parsed, named and written as the route module
writes them (no kernel needed)."""

import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
for path in (REPO / "bench", REPO / ".collections"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import decision_cost  # noqa: E402


def names(text):
    return [variant["name"] for variant in decision_cost.parse_cohort_variants(text)]


def test_none_comes_first_and_repeats_are_dropped():
    assert names("200in,1,0,hashclient,1,hashclient") == ["0", "200in", "1", "hashclient"]
    assert names("hashclient") == ["0", "hashclient"]
    assert names("") == ["0"]


def test_hashclient_is_a_route_without_cohorts_that_hashes_by_client():
    variant = decision_cost.cohort_variant("hashclient")
    assert variant["prefixes"] == 0
    assert variant["always_direct"] == [] and variant["never_direct"] == []
    assert variant["hash_mode"] == "client"
    assert "hash: client" in variant["title"]
    for name in ("0", "1", "200", "200in"):
        assert decision_cost.cohort_variant(name)["hash_mode"] == "connection"


def test_0lookup_is_a_route_without_cohorts_whose_trie_is_looked_up():
    assert names("0lookup,0lookup,1") == ["0", "0lookup", "1"]
    variant = decision_cost.cohort_variant("0lookup")
    assert variant["prefixes"] == 0 and variant["looks_trie_up"] is True
    assert variant["hash_mode"] == "connection"
    for name in ("0", "1", "200in", "hashclient"):
        assert not decision_cost.cohort_variant(name).get("looks_trie_up")


def test_set_cohort_route_rewrites_only_0lookups_entry_without_the_skip(monkeypatch):
    rewritten = []
    monkeypatch.setattr(
        decision_cost, "set_route", lambda layout, route, **options: {"after": route}
    )
    monkeypatch.setattr(
        decision_cost,
        "write_entry_without_the_skip",
        lambda layout, route: rewritten.append(route) or "unskipped",
    )
    for name in ("0", "hashclient", "200"):
        decision_cost.set_cohort_route(
            "layout", "svc", 8080, 100, decision_cost.cohort_variant(name)
        )
    assert rewritten == []
    variant = decision_cost.cohort_variant("0lookup")
    assert decision_cost.set_cohort_route("layout", "svc", 8080, 100, variant) == "unskipped"
    assert rewritten == ["svc"]


@pytest.mark.parametrize(
    "text", ["0lookups", "lookup", "hashclients", "hash", "client", "x", "1025", "0in", "-1"]
)
def test_unknown_variants_are_refused(text):
    with pytest.raises(ValueError):
        decision_cost.parse_cohort_variants(text)


def test_set_cohort_route_gives_set_route_the_hash_only_for_hashclient(monkeypatch):
    calls = []

    def fake_set_route(layout, route, **options):
        calls.append(options)
        return {"after": "entry"}

    monkeypatch.setattr(decision_cost, "set_route", fake_set_route)
    for name in ("0", "2", "1in", "hashclient"):
        variant = decision_cost.cohort_variant(name)
        assert decision_cost.set_cohort_route("layout", "svc", 8080, 100, variant) == "entry"
    assert calls == [
        {"port": 8080, "weight": 100},
        {
            "port": 8080,
            "weight": 100,
            "always_direct": ["127.0.0.2/32"],
            "never_direct": ["127.0.0.3/32"],
        },
        {"port": 8080, "weight": 100, "always_direct": ["127.0.0.1/32"], "never_direct": []},
        {"port": 8080, "weight": 100, "hash_mode": "client"},
    ]
