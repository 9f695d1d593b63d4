"""The Kubernetes API client: typed verbs (get, list, create, update, patch, apply, delete,
discovery) over the `Transport` (httpx on Trio, rate limiting, retries, rotating credentials),
and write observers. Watches live in `watch`, which uses the client; the client knows nothing
of them but the options they run with."""

from __future__ import annotations

import builtins
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, Self, TypeVar, cast, overload

import httpx
import msgspec

from nodeagent.kube import errors
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.metrics import WRITE_OBSERVER_ERRORS
from nodeagent.kube.models import ListHead, ObjectHead
from nodeagent.kube.resource import Resource
from nodeagent.kube.transport import Transport
from nodeagent.log import get_logger

log = get_logger(__name__)

T = TypeVar("T")
Body = bytes | Mapping[str, Any] | msgspec.Struct
PatchType = Literal["merge", "strategic", "json", "apply"]
Verb = Literal["create", "update", "patch", "delete"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}
_JSON = "application/json"


@dataclass(frozen=True, slots=True)
class WriteEvent:
    """A successful write made through the client; ``obj`` is the server's answer (None for a
    delete that removed the object)."""

    resource: Resource
    verb: Verb
    namespace: str | None
    name: str
    obj: bytes | None


@dataclass(frozen=True, slots=True)
class WatchOptions:
    """How watches through a client run (see `nodeagent.kube.watch.run_watch`).

    ``inactivity_timeout``: a watch silent this long (not even a bookmark) is reconnected.
    ``server_timeout``: the range the server-side ``timeoutSeconds`` of each watch request is
    drawn from (jittered so that watches opened together do not reconnect together).
    ``backoff``: (initial, max) delay between failing watch or list attempts.
    ``streaming_list``: how a (re)list is made: "off" pages with LIST; "on" is a streaming
    list (a watch with ``sendInitialEvents=true``, complete at the ``k8s.io/initial-events-end``
    bookmark); "auto" streams and falls back to LIST, for the rest of that watch's life, when
    the server refuses it as unsupported (400, 404, 405, 422).
    """

    inactivity_timeout: float = 70.0
    server_timeout: tuple[float, float] = (240.0, 300.0)
    backoff: tuple[float, float] = (0.5, 30.0)
    streaming_list: Literal["auto", "on", "off"] = "off"


@dataclass(frozen=True, slots=True)
class ListPage:
    body: bytes
    resource_version: str
    continue_token: str


@dataclass(frozen=True, slots=True)
class ListResult(Generic[T]):
    items: list[T]
    resource_version: str


class _DeletedMeta(msgspec.Struct):
    finalizers: list[str] = msgspec.field(default_factory=list)
    deletion_grace_period_seconds: int = msgspec.field(default=0, name="deletionGracePeriodSeconds")


class _DeletedHead(msgspec.Struct):
    kind: str = ""
    metadata: _DeletedMeta = msgspec.field(default_factory=_DeletedMeta)


class _RawList(msgspec.Struct):
    items: list[msgspec.Raw] | None = None


class _APIResource(msgspec.Struct, kw_only=True):
    name: str
    kind: str
    namespaced: bool


class _APIResourceList(msgspec.Struct, kw_only=True):
    resources: list[_APIResource] = msgspec.field(default_factory=list)


_head_decoder = msgspec.json.Decoder(ObjectHead)
_list_head_decoder = msgspec.json.Decoder(ListHead)
_encoder = msgspec.json.Encoder()


_decoders: dict[Any, Any] = {}


def _decoder(tp: type[T]) -> msgspec.json.Decoder[T]:
    dec = _decoders.get(tp)
    if dec is None:
        dec = _decoders[tp] = msgspec.json.Decoder(tp)
    return cast("msgspec.json.Decoder[T]", dec)


def _decode(data: bytes | memoryview, tp: type[T] | None) -> Any:
    return bytes(data) if tp is None else _decoder(tp).decode(data)


def encode_body(obj: Body) -> bytes:
    return obj if isinstance(obj, bytes) else _encoder.encode(obj)


def selector_params(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    """The query parameters of a list, watch or deletecollection's selectors."""
    params: dict[str, str] = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


class KubeClient(Transport):
    """An async Kubernetes API client; use as ``async with KubeClient(config) as client``.

    Reads return raw JSON bytes, or a decoded struct when ``into=`` names a type. Writes take
    bytes, a dict or a struct the caller built (never a decoded view: it lacks the fields the
    view does not declare). Any other call goes through `Transport.request` / `.stream`, which
    the client is.

    ``qps``/``burst``: the token bucket every request, list and watch (re)connect shares.
    ``request_timeout``: deadline of one unary attempt. ``max_attempts``, ``retry_backoff``
    (initial, max seconds): bounded retries of unary calls; ``max_retry_after`` caps a server's
    Retry-After (watches included). ``watch``: how watches through this client run
    (`WatchOptions`). ``page_size``: ``limit`` of list pages. ``token_reread_interval``: token
    files are re-read this often (and after a 401). ``exec_skew``: exec credentials are renewed
    this long before they expire. ``transport``: an httpx transport to use instead of real
    connections (tests).
    """

    def __init__(
        self,
        config: ClusterConfig,
        *,
        qps: float = 20.0,
        burst: int = 40,
        request_timeout: float = 30.0,
        connect_timeout: float = 10.0,
        watch: WatchOptions | None = None,
        max_attempts: int = 5,
        retry_backoff: tuple[float, float] = (0.2, 5.0),
        max_retry_after: float = 60.0,
        page_size: int = 500,
        token_reread_interval: float = 60.0,
        exec_skew: float = 300.0,
        rng: random.Random | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(
            config,
            qps=qps,
            burst=burst,
            request_timeout=request_timeout,
            connect_timeout=connect_timeout,
            max_attempts=max_attempts,
            retry_backoff=retry_backoff,
            max_retry_after=max_retry_after,
            token_reread_interval=token_reread_interval,
            exec_skew=exec_skew,
            rng=rng or random.Random(),
            transport=transport,
        )
        self.watch_options = watch or WatchOptions()
        self.page_size = page_size
        self._observers: builtins.list[Callable[[WriteEvent], None]] = []
        self._discovery: dict[str, dict[str, Resource]] = {}

    # -- lifecycle ------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- write observers ------------------------------------------------------------------

    @contextmanager
    def observe_writes(self, fn: Callable[[WriteEvent], None]) -> Iterator[None]:
        """Call ``fn`` after every successful write made through this client, until the block
        ends: an observer lives exactly as long as the task that holds it, so a restarted
        consumer never leaves its predecessor's observer behind."""
        self._observers.append(fn)
        try:
            yield
        finally:
            self._observers.remove(fn)

    def _notify(
        self, resource: Resource, verb: Verb, namespace: str | None, name: str, obj: bytes | None
    ) -> None:
        event = WriteEvent(resource, verb, namespace, name, obj)
        # A copy: an observer may end its own (or another's) observation while being called.
        for fn in tuple(self._observers):
            try:
                fn(event)
            except Exception as exc:
                WRITE_OBSERVER_ERRORS.inc()
                log.exception("write observer failed", observer=repr(fn), error=str(exc))

    # -- reads ----------------------------------------------------------------------------

    @overload
    async def get(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> bytes: ...

    @overload
    async def get(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        into: type[T],
        subresource: str | None = None,
    ) -> T: ...

    async def get(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        into: type[Any] | None = None,
        subresource: str | None = None,
    ) -> Any:
        """The object's JSON bytes, or the object decoded into ``into``."""
        data = await self.request(
            "GET", resource.path(namespace, name, subresource), verb="get", resource=resource.plural
        )
        return _decode(data, into)

    async def list_pages(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[ListPage]:
        """The raw List bodies of a paged list (``limit``/``continue``), one per page."""
        params = selector_params(label_selector, field_selector)
        params["limit"] = str(page_size or self.page_size)
        path = resource.path(namespace)
        while True:
            data = await self.request(
                "GET", path, params=params, verb="list", resource=resource.plural
            )
            try:
                meta = _list_head_decoder.decode(data).metadata
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise errors.BadResponse(f"list {path}: {exc}") from None
            yield ListPage(data, meta.resource_version, meta.continue_)
            if not meta.continue_:
                return
            params["continue"] = meta.continue_

    @overload
    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> ListResult[bytes]: ...

    @overload
    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        into: type[T],
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> ListResult[T]: ...

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        into: type[Any] | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> ListResult[Any]:
        """Every item across all pages (raw bytes each, or decoded into ``into``).

        If a continue token expires mid-way (410), the list starts over once, like client-go's
        pager.
        """
        items_type: Any = _RawList if into is None else _typed_list(into)
        decoder = _decoder(items_type)
        for restart in (False, True):
            items: builtins.list[Any] = []
            rv = ""
            try:
                async for page in self.list_pages(
                    resource,
                    namespace,
                    label_selector=label_selector,
                    field_selector=field_selector,
                    page_size=page_size,
                ):
                    decoded = decoder.decode(page.body)
                    got = decoded.items or []
                    items.extend([bytes(i) for i in got] if into is None else got)
                    rv = page.resource_version
            except errors.Gone:
                if restart:
                    raise
                continue
            return ListResult(items, rv)
        raise AssertionError("unreachable")

    async def discover(self, api_version: str, kind: str) -> Resource:
        """The resource serving ``kind`` in ``api_version``, found through discovery (cached;
        an unknown kind refreshes the cache once, e.g. for a CRD just established)."""
        kinds = self._discovery.get(api_version)
        if kinds is None or kind not in kinds:
            kinds = await self._discover_group_version(api_version)
            self._discovery[api_version] = kinds
        if kind not in kinds:
            raise errors.NotFound(404, "NotFound", f"kind {kind} is not served by {api_version}")
        return kinds[kind]

    async def _discover_group_version(self, api_version: str) -> dict[str, Resource]:
        group, _, version = api_version.rpartition("/")
        path = f"/apis/{group}/{version}" if group else f"/api/{version}"
        data = await self.request("GET", path, verb="discover", resource="")
        found: dict[str, Resource] = {}
        for r in msgspec.json.decode(data, type=_APIResourceList).resources:
            if "/" in r.name:  # a subresource such as nodes/status
                continue
            found.setdefault(
                r.kind,
                Resource(
                    group=group,
                    version=version,
                    plural=r.name,
                    kind=r.kind,
                    namespaced=r.namespaced,
                ),
            )
        return found

    # -- writes ---------------------------------------------------------------------------

    def _written(self, resource: Resource, verb: Verb, namespace: str | None, data: bytes) -> None:
        if self._observers:
            try:
                meta = _head_decoder.decode(data).metadata
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning(
                    "write answer is not an object", resource=resource.plural, error=str(exc)
                )
                return
            self._notify(resource, verb, meta.namespace or namespace, meta.name, data)

    @overload
    async def create(
        self, resource: Resource, obj: Body, namespace: str | None = None
    ) -> bytes: ...

    @overload
    async def create(
        self, resource: Resource, obj: Body, namespace: str | None = None, *, into: type[T]
    ) -> T: ...

    async def create(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        into: type[Any] | None = None,
    ) -> Any:
        """POST a new object (``metadata.generateName`` works: the answer carries the name)."""
        data = await self.request(
            "POST",
            resource.path(namespace),
            body=encode_body(obj),
            content_type=_JSON,
            verb="create",
            resource=resource.plural,
            idempotent=False,
        )
        self._written(resource, "create", namespace, data)
        return _decode(data, into)

    @overload
    async def update(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
    ) -> bytes: ...

    @overload
    async def update(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        into: type[T],
        subresource: str | None = None,
    ) -> T: ...

    async def update(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        into: type[Any] | None = None,
        subresource: str | None = None,
    ) -> Any:
        """PUT a whole object the caller owns. Its ``metadata.resourceVersion`` is required and
        is the precondition: a concurrent change gives `Conflict`."""
        body = encode_body(obj)
        meta = _head_decoder.decode(body).metadata
        if not meta.name:
            raise ValueError(f"update {resource.plural}: metadata.name is required")
        if not meta.resource_version:
            raise ValueError(
                f"update {resource.plural}/{meta.name}: metadata.resourceVersion is required "
                "(optimistic concurrency); use patch or apply for unconditional writes"
            )
        data = await self.request(
            "PUT",
            resource.path(namespace, meta.name, subresource),
            body=body,
            content_type=_JSON,
            verb="update",
            resource=resource.plural,
        )
        self._written(resource, "update", namespace, data)
        return _decode(data, into)

    @overload
    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Body | builtins.list[Any],
        namespace: str | None = None,
        *,
        type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
    ) -> bytes: ...

    @overload
    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Body | builtins.list[Any],
        namespace: str | None = None,
        *,
        into: type[T],
        type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
    ) -> T: ...

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Body | builtins.list[Any],
        namespace: str | None = None,
        *,
        into: type[Any] | None = None,
        type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
    ) -> Any:
        """PATCH with a merge, strategic-merge or JSON patch, or server-side apply (``type=
        "apply"`` needs ``field_manager``; ``force`` takes over conflicting fields)."""
        return await self._patch(
            resource, name, patch, namespace, into, type, field_manager, force, subresource
        )

    async def _patch(
        self,
        resource: Resource,
        name: str,
        patch: Body | builtins.list[Any],
        namespace: str | None,
        into: type[Any] | None,
        type: PatchType,
        field_manager: str | None,
        force: bool,
        subresource: str | None,
    ) -> Any:
        if type not in _PATCH_CONTENT_TYPES:
            raise ValueError(
                f"patch type {type!r}: must be one of {', '.join(_PATCH_CONTENT_TYPES)}"
            )
        params: dict[str, str] = {}
        if field_manager:
            params["fieldManager"] = field_manager
        if type == "apply":
            if not field_manager:
                raise ValueError("server-side apply needs a field_manager")
            if force:
                params["force"] = "true"
        elif force:
            raise ValueError("force applies only to server-side apply")
        body = patch if isinstance(patch, bytes) else _encoder.encode(patch)
        data = await self.request(
            "PATCH",
            resource.path(namespace, name, subresource),
            params=params,
            body=body,
            content_type=_PATCH_CONTENT_TYPES[type],
            verb="patch",
            resource=resource.plural,
            # A JSON patch may add to a list: repeating it after a lost answer is not safe.
            idempotent=type != "json",
        )
        self._written(resource, "patch", namespace, data)
        return _decode(data, into)

    async def apply(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        field_manager: str,
        force: bool = False,
        subresource: str | None = None,
        into: type[Any] | None = None,
    ) -> Any:
        """Server-side apply of ``obj`` (it must carry apiVersion, kind and metadata.name)."""
        body = encode_body(obj)
        name = _head_decoder.decode(body).metadata.name
        if not name:
            raise ValueError(f"apply {resource.plural}: metadata.name is required")
        return await self._patch(
            resource, name, body, namespace, into, "apply", field_manager, force, subresource
        )

    async def delete(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        resource_version: str | None = None,
        propagation_policy: Literal["Orphan", "Background", "Foreground"] | None = None,
        grace_period_seconds: int | None = None,
    ) -> bytes | None:
        """Delete an object, optionally only if its UID / resourceVersion still match (else
        `Conflict`). Returns None if it is gone, or its JSON if it still exists (finalizers)."""
        data = await self.request(
            "DELETE",
            resource.path(namespace, name),
            body=_delete_options(uid, resource_version, propagation_policy, grace_period_seconds),
            content_type=_JSON,
            verb="delete",
            resource=resource.plural,
        )
        remaining = data if _still_exists(data) else None
        if self._observers:
            if remaining is None:
                self._notify(resource, "delete", namespace, name, None)
            else:
                self._written(resource, "update", namespace, remaining)
        return remaining

    async def delete_collection(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        propagation_policy: Literal["Orphan", "Background", "Foreground"] | None = None,
    ) -> None:
        """Delete every object matching the selectors (all of them without selectors)."""
        data = await self.request(
            "DELETE",
            resource.path(namespace),
            params=selector_params(label_selector, field_selector),
            body=_delete_options(None, None, propagation_policy, None),
            content_type=_JSON,
            verb="deletecollection",
            resource=resource.plural,
        )
        if not self._observers:
            return
        try:
            deleted = msgspec.json.decode(data, type=_RawList).items or []
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            log.warning("deletecollection answer is not a list", error=str(exc))
            return
        for raw in deleted:
            item = bytes(raw)
            if _still_exists(item):
                self._written(resource, "update", namespace, item)
            else:
                meta = _head_decoder.decode(item).metadata
                self._notify(resource, "delete", meta.namespace or namespace, meta.name, None)


_typed_lists: dict[Any, type[Any]] = {}


def _typed_list(tp: type[Any]) -> type[Any]:
    """A ``{items: [tp]}`` struct to decode a List page in one pass."""
    found = _typed_lists.get(tp)
    if found is None:
        items_type = cast(Any, builtins.list)[tp] | None
        name = f"{getattr(tp, '__name__', 'Item')}List"
        found = _typed_lists[tp] = msgspec.defstruct(name, [("items", items_type, None)])
    return found


def _delete_options(
    uid: str | None,
    resource_version: str | None,
    propagation_policy: str | None,
    grace_period_seconds: int | None,
) -> bytes:
    opts: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
    pre = {}
    if uid:
        pre["uid"] = uid
    if resource_version:
        pre["resourceVersion"] = resource_version
    if pre:
        opts["preconditions"] = pre
    if propagation_policy:
        opts["propagationPolicy"] = propagation_policy
    if grace_period_seconds is not None:
        opts["gracePeriodSeconds"] = grace_period_seconds
    return _encoder.encode(opts)


def _still_exists(data: bytes) -> bool:
    """Whether a DELETE answer is an object that still exists (finalizers or a grace period)
    rather than a Status or the final state of a removed object."""
    try:
        head = msgspec.json.decode(data, type=_DeletedHead)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False  # no object in the answer: nothing is left to report
    if head.kind == "Status":
        return False
    return bool(head.metadata.finalizers) or head.metadata.deletion_grace_period_seconds > 0
