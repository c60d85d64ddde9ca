"""Weight input: percent with at most two decimals, stored as basis points."""

from decimal import Decimal

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    bp_to_percent,
    parse_weight,
)


@pytest.mark.parametrize(
    ("given", "basis_points"),
    [
        (0, 0),
        (100, 10000),
        (1, 100),
        (5, 500),
        (12.5, 1250),
        (12.34, 1234),
        (99.99, 9999),
        (0.01, 1),
        ("20", 2000),
        (" 7.25 ", 725),
        ("100.00", 10000),
        ("0.10", 10),
        (Decimal("33.33"), 3333),
        (1e1, 1000),
    ],
)
def test_accepts_percent_with_two_decimals(given, basis_points):
    assert parse_weight(given) == basis_points


@pytest.mark.parametrize(
    "given",
    [
        -1,
        100.001,
        12.345,
        "abc",
        "",
        True,
        False,
        None,
        [],
        {},
        "nan",
        float("inf"),
        "-0.01",
        101,
        "1e3",
    ],
)
def test_rejects_everything_else_naming_the_field(given):
    with pytest.raises(FleetError) as caught:
        parse_weight(given)
    assert caught.value.message.startswith("weight must be a percentage from 0 to 100")
    assert caught.value.details["field"] == "weight"


def test_error_names_the_given_field():
    with pytest.raises(FleetError, match=r"^canary_weight must be"):
        parse_weight("x", field="canary_weight")


@pytest.mark.parametrize(
    ("basis_points", "percent"), [(0, 0), (10000, 100), (1250, 12.5), (1, 0.01)]
)
def test_basis_points_back_to_percent(basis_points, percent):
    assert bp_to_percent(basis_points) == percent
    assert parse_weight(bp_to_percent(basis_points)) == basis_points
