"""The registry watcher: the desired state follows the sockets in the registry directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.core.errors import ConfigError
from nodeagent.plugins import watcher as watcher_module
from nodeagent.plugins.state import ActualPlugin, Caches
from tests.support.fake_plugins import Kicks, listen, record


def _watcher(registry: Path) -> tuple[watcher_module.RegistryWatcher, Caches, Kicks]:
    caches, kicks = Caches(), Kicks()
    watcher = watcher_module.RegistryWatcher(
        str(registry), 1.0, caches, kick=kicks.kick, changed=kicks.changed
    )
    watcher.prepare_root()
    return watcher, caches, kicks


def test_a_socket_found_is_desired_and_a_rescan_without_change_does_not_kick(
    registry: Path,
) -> None:
    watcher, caches, kicks = _watcher(registry)
    with listen(registry / "sub" / "a.sock"):
        watcher.scan()
        path = str(registry / "sub" / "a.sock")
        assert [p.socket for p in caches.desired.plugins()] == [path]
        assert watcher.scanned and watcher.scan_error == ""
        assert kicks.kicks == 1
        watcher.scan()
        assert kicks.kicks == 1


def test_a_removed_socket_leaves_and_a_recreated_one_gets_a_new_generation(
    registry: Path,
) -> None:
    watcher, caches, kicks = _watcher(registry)
    path = registry / "a.sock"
    with listen(path):
        watcher.scan()
    first = caches.desired.get(str(path))
    assert first is not None
    os.unlink(path)
    with listen(path):
        watcher.scan()
        second = caches.desired.get(str(path))
        assert second is not None and second.generation != first.generation
    os.unlink(path)
    watcher.scan()
    assert caches.desired.get(str(path)) is None
    assert kicks.kicks == 3


def test_a_vanished_registry_is_recreated_and_its_plugins_are_gone(registry: Path) -> None:
    watcher, caches, _ = _watcher(registry)
    with listen(registry / "a.sock"):
        watcher.scan()
    assert caches.desired.plugins()
    os.unlink(registry / "a.sock")
    os.rmdir(registry)
    watcher.scan()
    assert registry.is_dir()
    assert caches.desired.plugins() == []


def test_a_failing_scan_keeps_the_desired_state_and_is_announced_once_per_error(
    registry: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher, caches, kicks = _watcher(registry)
    with listen(registry / "a.sock"):
        watcher.scan()

        def denied(root: str) -> None:
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr(watcher_module, "scan_registry", denied)
        watcher.scan()
        watcher.scan()
        assert watcher.scan_error == f"{registry}: Permission denied"
        assert kicks.changes == 1
        assert len(caches.desired.plugins()) == 1
        monkeypatch.undo()
        watcher.scan()
        assert watcher.scan_error == ""


def test_an_unusable_registry_dir_is_a_config_error(registry: Path) -> None:
    (registry / "file").write_text("")
    watcher = watcher_module.RegistryWatcher(
        str(registry / "file" / "reg"), 1.0, Caches(), kick=lambda: None, changed=lambda: None
    )
    with pytest.raises(ConfigError, match=r"plugins\.registry_dir"):
        watcher.prepare_root()


def test_a_plugins_endpoint_is_not_a_plugin(registry: Path) -> None:
    watcher, caches, _ = _watcher(registry)
    reg_path, endpoint = str(registry / "reg.sock"), str(registry / "drv" / "dra.sock")
    with listen(registry / "reg.sock"), listen(registry / "drv" / "dra.sock"):
        watcher.scan()
        assert caches.desired.get(endpoint) is not None
        # The plugin at reg.sock names dra.sock as its endpoint: the scan's entry goes.
        record(caches, reg_path, 1, endpoint_real=endpoint)
        watcher.drop_endpoint(endpoint)
        assert caches.desired.get(endpoint) is None and endpoint not in watcher.seen
        watcher.scan()
        assert caches.desired.get(endpoint) is None
        assert caches.desired.get(reg_path) is not None


def test_a_registered_plugin_named_as_another_ones_endpoint_stays(registry: Path) -> None:
    watcher, caches, _ = _watcher(registry)
    first, second = str(registry / "first.sock"), str(registry / "second.sock")
    with listen(registry / "first.sock"), listen(registry / "second.sock"):
        watcher.scan()
        caches.actual.add(ActualPlugin(first, 1, "T", "first", first, ()))
        record(caches, second, 2, endpoint_real=first)
        watcher.drop_endpoint(first)
        watcher.scan()
        assert caches.desired.get(first) is not None
