"""End to end over real unix sockets: plugins that misbehave, and the manager's answers."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import tempfile
from typing import Any

import pytest
import trio
from grpclib import GRPCError
from grpclib.const import Status
from grpclib.encoding.proto import ProtoCodec
from grpclib.server import Server
from prometheus_client import REGISTRY

from nodeagent.core.errors import ConfigError
from nodeagent.plugins import PluginData, PluginManager, PluginSettings
from nodeagent.plugins.handler import PluginEndpoint
from nodeagent.plugins.reporter_plugin import ReporterHandler
from nodeagent.protos.pluginregistration.v1 import api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_pb2 as rep
from nodeagent.rpc import GrpcBridge
from nodeagent.sdk import DevicePlugin, ReporterPlugin, ReportItem
from tests.plugins.conftest import fast_settings
from tests.plugins.support import (
    WAIT,
    CrashingReporter,
    ScriptedRegistration,
    plugin_status,
    report,
    report_of,
    state_of,
    status_item,
    wait_until,
)


def _value(data: PluginData) -> bytes:
    value: bytes = report_of(data).content[0].field[0].value
    return value


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _errors(kind: str) -> float:
    return _metric("nodeagent_plugin_errors_total", kind=kind)


def _info(name: str, plugin_type: str = "ReporterPlugin", **kw: object) -> reg.PluginInfo:
    versions = kw.pop("versions", ["v1alpha1"])
    return reg.PluginInfo(type=plugin_type, name=name, supported_versions=versions, **kw)  # type: ignore[arg-type]


async def test_slow_get_info_fails_then_registers_when_the_plugin_answers_in_time(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    service = ScriptedRegistration(_info("slow"), get_info_delay=2.0)
    path = os.path.join(registry, "slow.sock")
    async with bridge.serve([service, CrashingReporter(crashes=0)], path):
        await wait_until(manager, lambda: state_of(manager, "") == "failed")
        status = plugin_status(manager, "")
        assert status is not None
        assert "DEADLINE_EXCEEDED" in status["last_error"]
        service.get_info_delay = 0.0
        await wait_until(manager, lambda: state_of(manager, "slow") == "registered")
        assert (await service.wait_notified()).plugin_registered


async def test_wrong_versions_are_refused_with_a_reason_and_retried(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    service = ScriptedRegistration(_info("gpu", "DRAPlugin", versions=["2.0.0", "0.9"]))
    async with bridge.serve([service], os.path.join(registry, "gpu.sock")):
        first = await service.wait_notified(1)
        assert not first.plugin_registered
        assert "plugin validation failed with err" in first.error
        assert "need major version 1" in first.error
        await wait_until(manager, lambda: state_of(manager, "gpu") == "failed")
        # Retried with backoff (the kubelet retries validation failures too).
        second = await service.wait_notified(2)
        assert not second.plugin_registered
        # The plugin fixes its answer: the next retry registers it.
        service.info.supported_versions[:] = ["1.0.0"]
        await wait_until(manager, lambda: state_of(manager, "gpu") == "registered")


async def test_empty_name_and_unknown_type_are_refused(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    nameless = ScriptedRegistration(_info(""))
    unknown = ScriptedRegistration(_info("csi", "CSIPlugin", versions=["1.0.0"]))
    errors_before = _errors("unknown_type")
    async with (
        bridge.serve([nameless], os.path.join(registry, "nameless.sock")),
        bridge.serve([unknown], os.path.join(registry, "csi.sock")),
    ):
        refused = await nameless.wait_notified()
        assert not refused.plugin_registered
        assert "plugin name is empty" in refused.error
        refused = await unknown.wait_notified()
        assert not refused.plugin_registered
        assert "no handler registered for plugin type: 'CSIPlugin'" in refused.error
        await wait_until(manager, lambda: state_of(manager, "csi") == "failed")
        assert _errors("unknown_type") > errors_before


async def test_plugin_crashing_mid_stream_is_restarted_with_backoff(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")
    reporter = CrashingReporter(crashes=3)
    service = ScriptedRegistration(_info("crashy"))
    restarts_before = _metric("nodeagent_plugin_stream_restarts_total", type="ReporterPlugin")
    messages_before = _metric("nodeagent_plugin_messages_total", type="ReporterPlugin")
    stream_errors_before = _errors("stream")
    async with bridge.serve([service, reporter], os.path.join(registry, "crashy.sock")):
        await wait_until(manager, lambda: reporter.calls >= 4 and "crashy" in channel.value)
        await wait_until(
            manager,
            lambda: report_of(channel.value["crashy"]).content[0].field[0].value == b"4",
        )
        status = plugin_status(manager, "crashy")
        assert status is not None
        assert status["stream_restarts"] == 3
        assert status["stream_state"] == "open"
        assert status["state"] == "registered"
        assert status["messages_received"] == 4
        # The same story in /metrics.
        restarts = _metric("nodeagent_plugin_stream_restarts_total", type="ReporterPlugin")
        assert restarts == restarts_before + 3
        messages = _metric("nodeagent_plugin_messages_total", type="ReporterPlugin")
        assert messages == messages_before + 4
        assert _errors("stream") == stream_errors_before + 3


async def test_plugin_process_restarting_on_the_same_path_re_registers(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")
    for generation in (1, 2):
        async with ReporterPlugin.serve(
            name="phoenix", registry_dir=registry, bridge=bridge
        ) as plugin:
            await plugin.report([ReportItem("g", "v1alpha1", "K", "Status", "gen", generation)])
            with trio.fail_after(WAIT):
                await plugin.wait_registered()
            await wait_until(
                manager,
                lambda g=generation: (
                    "phoenix" in channel.value  # type: ignore[misc]
                    and report_of(channel.value["phoenix"]).content[0].field[0].value
                    == str(g).encode()
                ),
            )


async def test_two_reporters_with_the_same_name_newest_wins(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    channel = manager.channel("ReporterPlugin")
    first_dir = os.path.join(registry, "one")
    second_dir = os.path.join(registry, "two")
    async with ReporterPlugin.serve(name="dup", registry_dir=first_dir, bridge=bridge) as first:
        await first.report([ReportItem("g", "v1alpha1", "K", "Status", "who", "first")])
        with trio.fail_after(WAIT):
            await first.wait_registered()
        await wait_until(manager, lambda: "dup" in channel.value)
        async with ReporterPlugin.serve(
            name="dup", registry_dir=second_dir, bridge=bridge
        ) as second:
            await second.report([ReportItem("g", "v1alpha1", "K", "Status", "who", "second")])
            with trio.fail_after(WAIT):
                await second.wait_registered()
            await wait_until(
                manager,
                lambda: report_of(channel.value["dup"]).content[0].field[0].value == b'"second"',
            )
            by_socket = {s["socket"]: s for s in manager.status()}
            assert (
                by_socket[first.socket_path]["stream_state"] == f"replaced by {second.socket_path}"
            )
            assert by_socket[second.socket_path]["stream_state"] == "open"
            # The first plugin's updates no longer reach the consumer.
            await first.report([ReportItem("g", "v1alpha1", "K", "Status", "who", "stale")])
            await second.report([ReportItem("g", "v1alpha1", "K", "Status", "who", "second-2")])
            await wait_until(
                manager,
                lambda: report_of(channel.value["dup"]).content[0].field[0].value == b'"second-2"',
            )
        # The replaced plugin leaving does not stop the newer one's data.
    await wait_until(manager, lambda: not channel.value["dup"].registered)


async def test_two_dra_plugins_with_the_same_name_need_a_higher_version(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    async with DevicePlugin.serve(
        name="drv", registry_dir=os.path.join(registry, "a"), bridge=bridge, api="seed"
    ) as first:
        with trio.fail_after(WAIT):
            await first.wait_registered()
        async with DevicePlugin.serve(
            name="drv", registry_dir=os.path.join(registry, "b"), bridge=bridge, api="seed"
        ) as same:
            status = await same.wait_registration()
            assert not status.plugin_registered
            assert "needs a strictly higher version" in status.error
        async with DevicePlugin.serve(
            name="drv",
            registry_dir=os.path.join(registry, "c"),
            bridge=bridge,
            api="seed",
            versions=["1.1.0"],
        ) as newer:
            with trio.fail_after(WAIT):
                await newer.wait_registered()


async def test_peer_credentials_rejection(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry), bridge, uid_check=lambda uid: False)
    await nursery.start(manager.run)
    rejected_before = (
        REGISTRY.get_sample_value(
            "nodeagent_plugin_registrations_total", {"type": "unknown", "outcome": "rejected"}
        )
        or 0.0
    )
    async with ReporterPlugin.serve(name="evil", registry_dir=registry, bridge=bridge) as plugin:
        status = await plugin.wait_registration()
        assert not status.plugin_registered
        assert f"uid {os.getuid()}, which is not an allowed plugin UID" in status.error
        await wait_until(manager, lambda: state_of(manager, "") == "rejected")
        # Never asked for GetInfo, and not retried for the same socket.
        assert plugin.registration.status.version == 1
    assert (
        REGISTRY.get_sample_value(
            "nodeagent_plugin_registrations_total", {"type": "unknown", "outcome": "rejected"}
        )
        == rejected_before + 1
    )


async def test_allowed_uids_setting_rejects_other_users(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    other = os.getuid() + 4242
    manager = PluginManager(fast_settings(registry, allowed_uids=[other]), bridge)
    await nursery.start(manager.run)
    async with ReporterPlugin.serve(name="evil", registry_dir=registry, bridge=bridge) as plugin:
        status = await plugin.wait_registration()
        assert "not an allowed plugin UID" in status.error


async def test_endpoint_outside_the_allowed_directories_is_refused(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    allowed = os.path.join(registry, "plugins")
    os.makedirs(allowed)
    manager = PluginManager(fast_settings(registry, endpoint_dirs=[allowed]), bridge)
    await nursery.start(manager.run)
    outside = tempfile.mkdtemp(prefix="na-out-", dir="/tmp")
    try:
        endpoint = os.path.join(outside, "dra.sock")
        service = ScriptedRegistration(
            _info("escape", "DRAPlugin", versions=["1.0.0"], endpoint=endpoint)
        )
        async with (
            bridge.serve([], endpoint),
            bridge.serve([service], os.path.join(registry, "escape.sock")),
        ):
            status = await service.wait_notified()
            assert not status.plugin_registered
            assert "outside the allowed endpoint directories" in status.error
            assert "plugins.endpoint_dirs" in status.error
            await wait_until(manager, lambda: state_of(manager, "escape") == "rejected")
        # A symlink inside an allowed directory pointing outside is refused the same way.
        link = os.path.join(allowed, "link.sock")
        os.symlink(endpoint, link)
        service = ScriptedRegistration(
            _info("escape2", "DRAPlugin", versions=["1.0.0"], endpoint=link)
        )
        async with (
            bridge.serve([], endpoint),
            bridge.serve([service], os.path.join(registry, "escape2.sock")),
        ):
            status = await service.wait_notified()
            assert "outside the allowed endpoint directories" in status.error
        # A relative endpoint is an error, as for the kubelet.
        service = ScriptedRegistration(
            _info("relative", "DRAPlugin", versions=["1.0.0"], endpoint="plugins/dra.sock")
        )
        async with bridge.serve([service], os.path.join(registry, "relative.sock")):
            status = await service.wait_notified()
            assert not status.plugin_registered
            assert "endpoint 'plugins/dra.sock' is not an absolute path" in status.error
    finally:
        shutil.rmtree(outside, ignore_errors=True)


async def test_invalid_and_oversized_messages_are_rejected_and_last_good_data_kept(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    manager = PluginManager(fast_settings(registry, max_message_bytes=2048), bridge)
    await nursery.start(manager.run)
    channel = manager.channel("ReporterPlugin")
    invalid_before = _errors("message_invalid")
    large_before = _errors("message_too_large")
    async with ReporterPlugin.serve(name="bad", registry_dir=registry, bridge=bridge) as plugin:
        await plugin.publish_message(report("good", b'{"v":1}'))
        await wait_until(manager, lambda: "bad" in channel.value)
        for bad in (
            report("broken", b"{not json"),
            report("", b"1"),
            rep.GetReportContentResponse(content=[rep.ReportContent(field=[])]),
        ):
            await plugin.publish_message(bad)
            rejected = status_item(manager, "bad")["messages_rejected"]
            await wait_until(
                manager,
                lambda r=rejected: status_item(manager, "bad")["messages_rejected"] > r,  # type: ignore[misc]
            )
        await plugin.publish_message(report("huge", json.dumps("x" * 4096).encode()))
        await wait_until(
            manager,
            # >= : the reopened stream sends the plugin's latest (oversized) message again.
            lambda: status_item(manager, "bad")["messages_rejected"] >= 4,
        )
        assert _errors("message_invalid") == invalid_before + 3
        assert _errors("message_too_large") >= large_before + 1
        assert report_of(channel.value["bad"]).content[0].field[0].fieldName == "good"
        status = plugin_status(manager, "bad")
        assert status is not None
        assert status["last_message"]["content"][0]["field"][0]["fieldName"] == "good"
        # Invalid messages were skipped on the same stream; the oversized one was refused from
        # its length prefix, body unread, so that stream was reset and reopened. The reopened
        # stream takes the next good message.
        await plugin.publish_message(report("better", b"2"))
        await wait_until(
            manager,
            lambda: report_of(channel.value["bad"]).content[0].field[0].fieldName == "better",
        )
        assert status_item(manager, "bad")["stream_restarts"] >= 1


async def test_unimplemented_stream_stops_without_forgetting_the_plugin(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    service = ScriptedRegistration(_info("lazy"))
    async with bridge.serve([service], os.path.join(registry, "lazy.sock")):
        await wait_until(
            manager,
            lambda: (plugin_status(manager, "lazy") or {}).get("stream_state") == "unimplemented",
        )
        assert state_of(manager, "lazy") == "registered"


async def test_plugin_that_stops_answering_probes_is_deregistered_then_comes_back(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    service = ScriptedRegistration(_info("flaky"))
    async with bridge.serve([service, CrashingReporter(0)], os.path.join(registry, "flaky.sock")):
        await wait_until(manager, lambda: "flaky" in manager.channel("ReporterPlugin").value)
        probes_before = _errors("probe")
        service.fail_get_info = True
        await wait_until(
            manager,
            lambda: not manager.channel("ReporterPlugin").value["flaky"].registered,
        )
        status = plugin_status(manager, "flaky")
        assert status is not None
        assert status["state"] == "failed"
        assert status["last_error"] == "deregistered after 2 failed probes"
        assert status["stream_state"] == "stopped"
        assert _errors("probe") >= probes_before + 2
        service.fail_get_info = False
        await wait_until(manager, lambda: state_of(manager, "flaky") == "registered")


def _replace_with_file(path: str) -> None:
    shutil.rmtree(path)
    with open(path, "w") as f:
        f.write("not a directory")


class _NoNotify(ScriptedRegistration):
    async def NotifyRegistrationStatus(self, stream: Any) -> None:
        raise GRPCError(Status.UNIMPLEMENTED, "no notify here")


async def test_failing_notify_does_not_undo_a_registration(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    notify_errors = _errors("notify")
    service = _NoNotify(_info("mute"))
    async with bridge.serve([service, CrashingReporter(0)], os.path.join(registry, "mute.sock")):
        await wait_until(manager, lambda: "mute" in manager.channel("ReporterPlugin").value)
        # The notify is sent once the plugin is registered, and its stream opened: its failure
        # can come back after the stream's first message. It changes no state the manager
        # announces, so it is polled (bounded); the registration must stand after it.
        with trio.fail_after(WAIT):
            while _errors("notify") < notify_errors + 1:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert state_of(manager, "mute") == "registered"
        assert manager.channel("ReporterPlugin").value["mute"].registered
        assert _errors("notify") == notify_errors + 1


class _RefusingReporterHandler(ReporterHandler):
    """A reporter handler whose Register step fails `refusals` times, then works."""

    def __init__(self, bridge: GrpcBridge, settings: PluginSettings, refusals: int) -> None:
        super().__init__(bridge, settings)
        self.refusals = refusals
        self.attempts: list[float] = []

    async def register(self, plugin: PluginEndpoint) -> None:
        self.attempts.append(trio.current_time())
        if len(self.attempts) <= self.refusals:
            raise RuntimeError(f"handler busy (attempt {len(self.attempts)})")
        await super().register(plugin)


async def test_failed_register_step_is_reported_and_retried_with_backoff(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    # The kubelet never retries a failed Register step; this manager does, with its backoff.
    settings = fast_settings(registry)
    handler = _RefusingReporterHandler(bridge, settings, refusals=2)
    manager = PluginManager(settings, bridge, handlers=[handler])
    await nursery.start(manager.run)
    register_errors = _errors("register")
    service = ScriptedRegistration(_info("picky"))
    async with bridge.serve([service, CrashingReporter(0)], os.path.join(registry, "picky.sock")):
        first = await service.wait_notified(1)
        assert not first.plugin_registered
        assert first.error == (
            "RegisterPlugin error -- plugin registration failed with err: handler busy (attempt 1)"
        )
        second = await service.wait_notified(2)
        assert not second.plugin_registered
        assert "handler busy (attempt 2)" in second.error
        third = await service.wait_notified(3)
        assert third.plugin_registered and third.error == ""
        await wait_until(manager, lambda: "picky" in manager.channel("ReporterPlugin").value)
        assert state_of(manager, "picky") == "registered"
    assert _errors("register") == register_errors + 2
    assert len(handler.attempts) == 3
    # Exponential backoff (0.05 s doubling): never retried before the backoff allows.
    first_gap = handler.attempts[1] - handler.attempts[0]
    second_gap = handler.attempts[2] - handler.attempts[1]
    assert first_gap >= settings.registration_backoff_initial
    assert second_gap >= 2 * settings.registration_backoff_initial


async def test_registry_trouble_is_reported_and_recovered(
    bridge: GrpcBridge, registry: str, nursery: trio.Nursery
) -> None:
    root = os.path.join(registry, "reg")
    # No probes: only what the registry scan does is under test (the socket goes with the dir).
    manager = PluginManager(fast_settings(root, probe_interval=600.0), bridge)
    assert manager.readiness() == (False, "plugin registry not scanned yet")
    await nursery.start(manager.run)
    assert manager.readiness()[0]
    async with ReporterPlugin.serve(name="r", registry_dir=root, bridge=bridge) as plugin:
        with trio.fail_after(WAIT):
            await plugin.wait_registered()
        # The directory is replaced by a file: scanning fails, nothing is deregistered.
        _replace_with_file(root)
        await wait_until(manager, lambda: not manager.readiness()[0])
        reason = manager.readiness()[1]
        assert "plugin registry scan failing" in reason and root in reason
        assert state_of(manager, "r") == "registered"
    # The file goes: the directory is recreated and the plugin, whose socket went with the
    # directory, is deregistered.
    os.unlink(root)
    await wait_until(manager, lambda: manager.readiness()[0])
    assert stat.S_ISDIR(os.stat(root).st_mode)
    await wait_until(manager, lambda: state_of(manager, "r") == "deregistered")


async def test_uncreatable_registry_dir_refuses_to_start_naming_the_field(
    bridge: GrpcBridge, registry: str
) -> None:
    _replace_with_file(registry)
    manager = PluginManager(fast_settings(os.path.join(registry, "sub")), bridge)
    with pytest.raises(ConfigError) as caught:
        await manager.run()
    assert caught.value.field == "plugins.registry_dir"
    assert "cannot create directory: Not a directory" in caught.value.rule


class _RawCodec(ProtoCodec):
    """Lets a test server put arbitrary bytes on the wire as a message."""

    def encode(self, message: Any, message_type: Any) -> bytes:
        return message if isinstance(message, bytes) else bytes(message.SerializeToString())


class _GarbageReporter(CrashingReporter):
    async def ListAndWatchReportContent(self, stream: Any) -> None:
        await stream.recv_message()
        await stream.send_message(report("before", b"1").SerializeToString())
        await stream.send_message(b"\x0a\x05ab")  # field 1, 5 bytes announced, 2 sent
        await stream.send_message(report("after", b"2").SerializeToString())
        await asyncio.Event().wait()


async def test_malformed_protobuf_is_rejected_and_the_stream_goes_on(
    manager: PluginManager, bridge: GrpcBridge, registry: str
) -> None:
    path = os.path.join(registry, "garbage.sock")
    services: list[ScriptedRegistration | _GarbageReporter] = [
        ScriptedRegistration(_info("garbage")),
        _GarbageReporter(0),
    ]

    async def start() -> Server:
        server = Server(services, codec=_RawCodec())
        await server.start(path=path)
        return server

    async def stop(server: Server) -> None:
        server.close()
        await server.wait_closed()

    malformed_before = _errors("message_malformed")
    server = await bridge.run_asyncio(start)
    try:
        channel = manager.channel("ReporterPlugin")
        await wait_until(
            manager,
            lambda: (
                "garbage" in channel.value
                and report_of(channel.value["garbage"]).content[0].field[0].fieldName == "after"
            ),
        )
        status = plugin_status(manager, "garbage")
        assert status is not None
        # "before" may be superseded by "after" before it is processed (the newest wins): the
        # bridge reads a stream ahead, so both can arrive in one batch.
        assert status["messages_received"] + status["messages_skipped"] == 2
        assert status["messages_received"] >= 1
        assert status["messages_rejected"] == 1
        assert status["stream_restarts"] == 0
        assert _errors("message_malformed") == malformed_before + 1
    finally:
        await bridge.run_asyncio(stop, server)
