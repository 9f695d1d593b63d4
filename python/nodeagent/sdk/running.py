"""What a plugin process needs around its `serve` blocks: where the agent looks, when to stop."""

from __future__ import annotations

import signal

import trio

from nodeagent.config.loader import default_registry_dir as _agent_registry_dir

__all__ = ["default_registry_dir", "stop_signal"]


def default_registry_dir() -> str:
    """The registry directory of an agent started with default settings on this machine:
    ``/var/lib/nodeagent/plugins_registry`` as root, else
    ``$XDG_STATE_HOME/nodeagent/plugins_registry`` (``~/.local/state/nodeagent/...``)."""
    return _agent_registry_dir()


async def stop_signal() -> signal.Signals:
    """Wait for SIGTERM or SIGINT (systemd stopping the service, the kubelet ending the pod,
    Ctrl-C) and return it. A plugin's main task awaits it and then leaves its `serve` blocks,
    which removes its sockets: killed by the signal's default action instead, a plugin leaves a
    socket nobody listens on. Call it from the Trio run of the main thread."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            return signal.Signals(signum)
    raise AssertionError("a signal receiver never ends")  # pragma: no cover
