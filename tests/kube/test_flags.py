"""The control plane's flags by version (flags.py), without the binaries: what 1.20 needs
and what later versions no longer take."""

from __future__ import annotations

import pytest

from .flags import (
    KubeVersion,
    apiserver_flags,
    controller_manager_flags,
    makes_token_secrets,
    pdb_api_version,
    scheduler_flags,
)

V1_20, V1_23, V1_24, V1_36 = (KubeVersion.parse(f"v1.{m}.2") for m in (20, 23, 24, 36))


@pytest.mark.parametrize(
    ("said", "want"),
    [
        ("Kubernetes v1.20.2\n", (1, 20, 2, "v1.20.2")),
        ("Kubernetes v1.36.2", (1, 36, 2, "v1.36.2")),
        ("v1.33.0-alpha.1.2+abc", (1, 33, 0, "v1.33.0-alpha.1.2+abc")),
        ("1.31.4", (1, 31, 4, "v1.31.4")),
    ],
)
def test_the_version_is_read_as_the_binary_says_it(
    said: str, want: tuple[int, int, int, str]
) -> None:
    v = KubeVersion.parse(said)
    assert (v.major, v.minor, v.patch, v.text) == want


def test_no_version_is_an_error() -> None:
    with pytest.raises(ValueError, match="no Kubernetes version"):
        KubeVersion.parse("error: unknown flag: --version")


def test_versions_order_by_number_not_text() -> None:
    assert V1_20 < V1_23 < V1_24 < V1_36
    assert KubeVersion.parse("v1.9.0") < V1_20
    assert V1_36.at_least(1, 24) and not V1_23.at_least(1, 24)


def test_insecure_serving_is_turned_off_only_where_the_flags_exist() -> None:
    assert apiserver_flags(V1_20, None) == ["--insecure-port=0"]
    assert apiserver_flags(V1_23, None) == ["--insecure-port=0"]
    assert apiserver_flags(V1_24, None) == []
    assert apiserver_flags(V1_36, None) == []
    assert controller_manager_flags(V1_20) == scheduler_flags(V1_20) == ["--port=0"]
    for later in (V1_23, V1_24, V1_36):
        assert controller_manager_flags(later) == scheduler_flags(later) == []


def test_the_pod_network_gives_the_api_server_its_address() -> None:
    assert apiserver_flags(V1_36, "10.244.0.1") == ["--advertise-address=10.244.0.1"]
    assert apiserver_flags(V1_20, "10.244.0.1")[-1] == "--advertise-address=10.244.0.1"


def test_token_secrets_are_made_until_1_24() -> None:
    assert makes_token_secrets(V1_20) and makes_token_secrets(V1_23)
    assert not makes_token_secrets(V1_24) and not makes_token_secrets(V1_36)


def test_the_served_pdb_version_is_followed() -> None:
    assert pdb_api_version({"policy/v1beta1"}) == "policy/v1beta1"
    assert pdb_api_version({"policy/v1", "policy/v1beta1"}) == "policy/v1"
    assert pdb_api_version({"policy/v1"}) == "policy/v1"
