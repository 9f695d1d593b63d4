"""The NodeAgentConfigOK condition on nodes/<node>/status: written only when it changed (the one
write per config change), its lastTransitionTime kept while the status stays, written again on
a re-created Node that lacks it, and a refused write retried with backoff (not per change)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from nodeagent.core.backoff import Backoff
from nodeagent.core.health import Lapses, describe, overdue
from nodeagent.core.wake import Wake
from nodeagent.dynconfig.controller import Controller
from nodeagent.dynconfig.status import CONDITION_TYPE, Condition, condition_patch
from nodeagent.kube import NODES, KubeClient, KubeError
from nodeagent.log import get_logger

log = get_logger(__name__)

__all__ = ["NODE_LISTED_WAIT", "ConditionWriter"]

# The condition's first write waits this long at most for the Node to be listed, so that it
# keeps the lastTransitionTime the Node shows (and is not written at all when unchanged).
NODE_LISTED_WAIT = 5.0


class ConditionWriter:
    """Writes the controller's condition on this node's Node, from the Node as the dynconfig
    component's watch shows it (`seen`, `listed`)."""

    def __init__(self, *, node_name: str, controller: Controller[Any], client: KubeClient) -> None:
        self.node_name = node_name
        self.controller = controller
        self._client = client
        self.written: Condition | None = None
        # The UID of the Node the last condition was written to, and an event set when a Node
        # of another UID (deleted and re-created by its kubelet) lacks it: written again.
        self._written_uid: str | None = None
        # The Node as last seen (None: not seen yet): its condition's lastTransitionTime is
        # kept while the status stays, and an agent restarted on an unchanged condition
        # does not write it again.
        self._node_seen: dict[str, Any] | None = None
        # (status, lastTransitionTime) of this process's last condition write: newer than any
        # Node view it holds (the watch of the Node lags behind our own writes).
        self._transition: tuple[str, str] | None = None
        self._node_listed = trio.Event()
        self._lost = Wake()
        self.error: str | None = None
        self.writes = 0
        self._failing: Lapses[str] = Lapses("dynconfig", "node_status_writes")

    def listed(self) -> None:
        """The Node is listed (or there is no Node view to wait for): the first write goes."""
        self._node_listed.set()

    def seen(self, node: dict[str, Any] | None) -> None:
        """The Node as the watch shows it now. Whether a re-created Node (another UID than the
        one written to) lacks the condition written last; if so (found by the fault matrix: it
        stayed lost until the next config change), forget it so that it is written again. The
        same Node seen without it is an older state than our write's, not a loss."""
        self._node_seen = node
        if self.written is None or self._written_uid is None:
            return
        uid = ((node or {}).get("metadata") or {}).get("uid")
        if node is None or uid == self._written_uid:
            return  # deleted: written again once it exists (its patch until then would 404)
        want = ("True" if self.written.status else "False", self.written.reason)
        conditions = (node.get("status") or {}).get("conditions") or []
        have = [
            (c.get("status"), c.get("reason"))
            for c in conditions
            if c.get("type") == CONDITION_TYPE
        ]
        if have != [want]:
            log.info("NodeAgentConfigOK condition missing on the Node: writing it again")
            self.written = None
            self._lost.set()

    async def run(self) -> None:
        # A refused write (RBAC without nodes/status) is retried with backoff, not per change.
        backoff = Backoff(1.0, 60.0)
        with trio.move_on_after(NODE_LISTED_WAIT):
            await self._node_listed.wait()
        while True:
            changed = self.controller.changed
            self._lost.clear()
            condition = self.controller.condition()
            if condition != self.written and not self._adopt(condition):
                await self._patch(condition)
                if self.error is not None:
                    await trio.sleep(backoff.next())
                    continue
                backoff.reset()
            elif self.error is not None:
                # Nothing left to write (the condition wanted went back to the one written
                # while a write failed): the failure is moot, not a status write failing.
                log.info("NodeAgentConfigOK condition as written: the failed write is moot")
                self.error = None
                backoff.reset()
            if self.controller.condition() == self.written:
                async with trio.open_nursery() as nursery:  # whichever comes first
                    for wait in (changed.wait, self._lost.wait):
                        nursery.start_soon(_cancel_when, wait, nursery.cancel_scope)

    def failing(self, bound: float) -> tuple[bool, str]:
        """(overdue, what to say): writes failing longer than `bound` make the component not
        ready; shorter (a control-plane restart) they are only said, readiness must not flip
        (nor roll a trial back). ("" while writes succeed.)"""
        now = trio.current_time()
        lapses = self._failing.observe({"condition": self.error} if self.error else {}, now)
        if not lapses:
            return False, ""
        what = "writing the NodeAgentConfigOK condition fails"
        return overdue(lapses, now, bound) is not None, describe(what, lapses[0], now, bound)

    def _shown(self) -> dict[str, Any] | None:
        """Our condition as the Node last seen shows it."""
        status = (self._node_seen or {}).get("status") or {}
        for c in status.get("conditions") or []:
            if c.get("type") == CONDITION_TYPE:
                return dict(c)
        return None

    def _adopt(self, condition: Condition) -> bool:
        """At start, before this process wrote anything: a Node already showing exactly
        `condition` (left by the previous run) is taken as written, not written again. Later
        the Node seen may predate our own last write, so it is never trusted that way."""
        shown = self._shown()
        if self.writes or self.written is not None or shown is None:
            return False
        same = (
            shown.get("status") == ("True" if condition.status else "False")
            and shown.get("reason") == condition.reason
            and shown.get("message") == condition.message
        )
        if same:
            self.written = condition
            self._written_uid = ((self._node_seen or {}).get("metadata") or {}).get("uid")
        return same

    async def _patch(self, condition: Condition) -> None:
        status = "True" if condition.status else "False"
        # The time the status last changed: our own last write's once there is one (the Node
        # seen may predate it: True -> False -> True kept the first time), else the Node's.
        last = self._transition
        if last is None:
            shown = self._shown() or {}
            last = (str(shown.get("status")), str(shown.get("lastTransitionTime") or ""))
        kept = (last[1] or None) if last[0] == status else None
        body = condition_patch(condition, time.time(), transitioned=kept)
        try:
            answer = await self._client.patch(
                NODES, self.node_name, body, type="strategic", subresource="status"
            )
        except KubeError as exc:
            self.error = str(exc)
            log.warning("NodeAgentConfigOK condition not written", error=str(exc))
            return
        self.error = None
        self.writes += 1
        self._transition = (status, body["status"]["conditions"][0]["lastTransitionTime"])
        self.written = condition
        self._written_uid = _uid(answer)


async def _cancel_when(wait: Callable[[], Awaitable[object]], scope: trio.CancelScope) -> None:
    await wait()
    scope.cancel()


def _uid(node: bytes) -> str | None:
    """metadata.uid of a Node the server returned (None if it cannot be read)."""
    try:
        uid = msgspec.json.decode(node, type=_NodeHead).metadata.uid
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    return uid or None


class _Meta(msgspec.Struct):
    uid: str = ""


class _NodeHead(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
