"""What plugin handlers hand to consumers: one plugin's last valid message.

A leaf type, so the consumers (the ResourceSlice publisher, later the CNR reporter) read typed
data from a handler's latest-value channel (`LatestValue[Mapping[str, PluginData]]`, keyed by
plugin name) without importing the plugins package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a type hint only: an idle node with no plugins never loads protobuf
    from google.protobuf.message import Message

__all__ = ["PluginData"]


@dataclass(frozen=True)
class PluginData:
    """The last valid message of one plugin, as handed to consumers."""

    name: str
    plugin_type: str
    endpoint: str
    message: Message
    received_at: float  # wall-clock seconds
    registered: bool  # False once deregistered: the data is kept (for a grace), marked stale
    # False while the plugin delivers nothing new: deregistered, or (a reporter plugin) its
    # stream ended and its unary polls fail; a consumer's grace for stopped plugins starts then.
    live: bool = True
