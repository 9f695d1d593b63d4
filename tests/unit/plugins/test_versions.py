from __future__ import annotations

import pytest

from nodeagent.plugins.handler import PluginValidationError
from nodeagent.plugins.versions import (
    NATIVE_DRA_SERVICE,
    dra_api,
    highest_supported_version,
    parse_generic_version,
    require_any_version,
)


@pytest.mark.parametrize(
    ("versions", "highest"),
    [
        (["1.0.0"], (1, 0, 0)),
        (["1.0.0", "1.2"], (1, 2)),
        (["v1.1.0", "2.0.0", "1.0.0"], (1, 1, 0)),  # major > 1 is skipped
        (["1.10.0", "1.9.0"], (1, 10, 0)),  # numeric, not lexical
    ],
)
def test_highest_supported_version_follows_the_seed_kubelet(
    versions: list[str], highest: tuple[int, ...]
) -> None:
    assert highest_supported_version(versions) == highest


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ([], "empty supported_versions"),
        (["2.0.0"], "need major version 1"),
        (["0.9.0"], "need major version 1"),
        (["1.0.0", "one"], "could not parse 'one'"),
        (["v1beta1.DRAPlugin"], "could not parse"),
        (["1"], "could not parse '1'"),
    ],
)
def test_unsupported_version_lists_are_refused_with_the_reason(
    versions: list[str], message: str
) -> None:
    with pytest.raises(PluginValidationError, match=message):
        highest_supported_version(versions)


def test_parse_generic_version_accepts_a_v_prefix() -> None:
    assert parse_generic_version("v1.2.3") == (1, 2, 3)


def test_reporter_versions_need_one_supported_entry() -> None:
    assert require_any_version(["v1alpha2", "v1alpha1"], ["v1alpha1"]) == "v1alpha1"
    with pytest.raises(PluginValidationError, match=r"none of the versions \['v2'\]"):
        require_any_version(["v2"], ["v1alpha1"])
    with pytest.raises(PluginValidationError):
        require_any_version([], ["v1alpha1"])


@pytest.mark.parametrize(
    ("versions", "api"),
    [
        (["nodeagent.device.v1alpha1.DevicePlugin"], "native"),
        (["1.0.0", "nodeagent.device.v1alpha1.DevicePlugin"], "native"),  # native wins
        (["v1.DRAPlugin", "nodeagent.device.v1alpha1.DevicePlugin"], "native"),
        (["1.0.0"], "seed"),
        (["v1.2"], "seed"),
        # What a modern driver (upstream kubeletplugin helper, 1.32+) advertises.
        (["v1.DRAPlugin", "v1beta1.DRAPlugin"], "kubelet-v1"),
        (["v1beta1.DRAPlugin"], "kubelet-v1"),
        (["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"], "kubelet-v1"),
    ],
)
def test_dra_api_prefers_the_native_service_name(versions: list[str], api: str) -> None:
    assert NATIVE_DRA_SERVICE == "nodeagent.device.v1alpha1.DevicePlugin"
    assert dra_api(versions) == api


@pytest.mark.parametrize(
    ("versions", "message"),
    [
        ([], "empty supported_versions"),
        (["v1alpha3.NodeService"], "could not parse 'v1alpha3.NodeService'"),
        (["nodeagent.device.v1alpha2.DevicePlugin"], "could not parse"),
        (["2.0.0"], "need major version 1"),
    ],
)
def test_dra_api_refuses_lists_with_neither_api(versions: list[str], message: str) -> None:
    with pytest.raises(PluginValidationError, match=message) as info:
        dra_api(versions)
    assert "nodeagent.device.v1alpha1.DevicePlugin" in str(info.value)
    assert "v1.DRAPlugin / v1beta1.DRAPlugin" in str(info.value)
