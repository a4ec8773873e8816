"""Durations and sizes in config files: what they accept and what they refuse."""

from __future__ import annotations

import math

import pytest

from backends.units import parse_duration, parse_size
from router.config import parse_config
from router.errors import ConfigError


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "1e400", -1, "-5s"])
def test_a_duration_is_a_finite_number_of_seconds(value: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(value)


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_yaml_nan_and_infinity_are_config_errors_that_name_the_key(value: str) -> None:
    import yaml

    data = yaml.safe_load(
        "targets: {t: {routes: [{path_prefix: /}], backend: {kind: static, url: 'http://x:1'},"
        f" scaling: {{idle_after: {value}}}}}}}"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "f.yaml")
    assert "targets.t.scaling.idle_after" in str(caught.value)
    assert "finite" in str(caught.value)


def test_durations_and_sizes_still_read_their_units() -> None:
    assert parse_duration("200ms") == pytest.approx(0.2)
    assert parse_duration(1.5) == 1.5
    assert parse_duration("2h") == 7200
    assert parse_size("100MiB") == 100 * 2**20
