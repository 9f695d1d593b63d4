"""The Kubernetes API client: typed verbs (get, list, create, update, patch, apply, delete,
discovery) over the `Transport` (httpx on Trio, rate limiting, retries, rotating credentials),
and write observers. Watches live in `watch`, which uses the client; the client knows nothing
of them but the options they run with."""

from __future__ import annotations

import builtins
import random
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, cast

import httpx
import msgspec

from nodeagent.kube import errors
from nodeagent.kube.auth import TokenSource
from nodeagent.kube.dryrun import DryRun
from nodeagent.kube.kubeconfig import ClusterConfig
from nodeagent.kube.metrics import WRITE_OBSERVER_ERRORS
from nodeagent.kube.models import ListHead, ObjectHead
from nodeagent.kube.ratelimit import TokenBucket
from nodeagent.kube.resource import Resource
from nodeagent.kube.transport import Transport
from nodeagent.log import get_logger

log = get_logger(__name__)

if TYPE_CHECKING:
    # A TypeVar default (PEP 696, in `typing` from 3.13) types ``into=`` in one signature per
    # verb: no ``into`` -> bytes, ``into=X`` -> X. At run time the default is not needed.
    from typing_extensions import TypeVar

    T = TypeVar("T", default=bytes)
else:
    from typing import TypeVar

    T = TypeVar("T")
# The default of ``into``: the raw JSON bytes. Typed Any so that it fits ``type[T]`` for any T
# (the TypeVar default above then says what the call returns).
RAW: Any = bytes
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
    ``max_event_bytes``: the most one event may decode to (a larger one fails the watch, which
    relists; None: unbounded).
    ``reconnect_spread``: a watch that was delivering and then broke (not the server's timely
    close) waits a random 0..this many seconds before its first reconnect, so that the watches
    of many agents an apiserver restart broke together do not come back together.
    """

    inactivity_timeout: float = 70.0
    server_timeout: tuple[float, float] = (240.0, 300.0)
    backoff: tuple[float, float] = (0.5, 30.0)
    streaming_list: Literal["auto", "on", "off"] = "off"
    max_event_bytes: int | None = None
    reconnect_spread: float = 0.0


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


def _decode(data: bytes | memoryview, tp: type[T]) -> T:
    return cast("T", bytes(data)) if tp is bytes else _decoder(tp).decode(data)


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


class KubeClient:
    """An async Kubernetes API client; use as ``async with KubeClient(config) as client``.

    Reads return raw JSON bytes, or a decoded struct when ``into=`` names a type. Writes take
    bytes, a dict or a struct the caller built (never a decoded view: it lacks the fields the
    view does not declare). Any other call goes through `request` / `stream`, which hand it to
    the client's `Transport` (the way httpx's Client sends through its transport).

    ``qps``/``burst``: the token bucket every request, list and watch (re)connect shares.
    ``request_timeout``: deadline of one unary attempt. ``max_attempts``, ``retry_backoff``
    (initial, max seconds): bounded retries of unary calls; ``max_retry_after`` caps a server's
    Retry-After (watches included). ``watch``: how watches through this client run
    (`WatchOptions`). ``page_size``: ``limit`` of list pages. ``token_reread_interval``: token
    files are re-read this often (and after a 401). ``exec_skew``: exec credentials are renewed
    this long before they expire. ``transport``: a `Transport` to send through (the other
    transport parameters are then its own), or an httpx transport to use instead of real
    connections (tests). ``dry_run``: send every write with ``dryRun=All`` and record it
    there (`nodeagent.kube.dryrun`). ``max_response_bytes``: the most a response body may
    decode to (`errors.BodyTooLarge` past it; None: unbounded).
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
        transport: Transport | httpx.AsyncBaseTransport | None = None,
        dry_run: DryRun | None = None,
        max_response_bytes: int | None = None,
    ) -> None:
        if isinstance(transport, Transport):
            self.transport = transport
        else:
            self.transport = Transport(
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
                max_response_bytes=max_response_bytes,
            )
        # Every write goes with dryRun=All and is recorded there (None: writes are real).
        self.dry_run = dry_run
        if dry_run is not None:
            self.transport.dry_run = True
        self.watch_options = watch or WatchOptions()
        self.page_size = page_size
        self._observers: builtins.list[Callable[[WriteEvent], None]] = []
        self._discovery: dict[str, dict[str, Resource]] = {}

    # -- the transport's face ---------------------------------------------------------------

    @property
    def config(self) -> ClusterConfig:
        return self.transport.config

    @property
    def limiter(self) -> TokenBucket:
        return self.transport.limiter

    @property
    def rng(self) -> random.Random:
        return self.transport.rng

    @property
    def max_retry_after(self) -> float:
        return self.transport.max_retry_after

    @property
    def tokens(self) -> TokenSource | None:
        return self.transport.tokens

    @tokens.setter
    def tokens(self, tokens: TokenSource | None) -> None:
        self.transport.tokens = tokens

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: bytes | None = None,
        content_type: str | None = None,
        verb: str = "",
        resource: str = "",
        idempotent: bool = True,
    ) -> bytes:
        """One API call through the transport (see `Transport.request`). The typed verbs
        call it too, so a wrapper set on the instance sees every request."""
        return await self.transport.request(
            method,
            path,
            params=params,
            body=body,
            content_type=content_type,
            verb=verb,
            resource=resource,
            idempotent=idempotent,
        )

    def stream(
        self,
        path: str,
        params: Mapping[str, str],
        *,
        read_timeout: float,
        verb: str = "watch",
        resource: str = "",
    ) -> AbstractAsyncContextManager[httpx.Response]:
        """A streaming GET through the transport (see `Transport.stream`); watches open
        theirs here, so a subclass may wrap it."""
        return self.transport.stream(
            path, params, read_timeout=read_timeout, verb=verb, resource=resource
        )

    def open(self) -> None:
        self.transport.open()

    async def aclose(self) -> None:
        await self.transport.aclose()

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
        consumer never leaves its predecessor's observer behind. A dry run's writes are not
        observed: nothing will reach the watch, so the readers' view stays the cluster's."""
        self._observers.append(fn)
        try:
            yield
        finally:
            self._observers.remove(fn)

    @property
    def _observing(self) -> bool:
        return bool(self._observers) and self.dry_run is None

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

    async def get(
        self,
        resource: Resource,
        name: str,
        namespace: str | None = None,
        *,
        into: type[T] = RAW,
        subresource: str | None = None,
    ) -> T:
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

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        into: type[T] = RAW,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = None,
    ) -> ListResult[T]:
        """Every item across all pages (raw bytes each, or decoded into ``into``).

        If a continue token expires mid-way (410), the list starts over once, like client-go's
        pager.
        """
        raw = into is bytes
        items_type: Any = _RawList if raw else _typed_list(into)
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
                    items.extend([bytes(i) for i in got] if raw else got)
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

    async def _write(
        self,
        resource: Resource,
        method: str,
        path: str,
        body: bytes,
        *,
        verb: str,
        params: Mapping[str, str] | None = None,
        content_type: str = _JSON,
        idempotent: bool = True,
        namespace: str | None = None,
        name: str = "",
    ) -> tuple[bytes, bool]:
        """Sends a write: (the answer, whether the server gave it now and it is still to be
        recorded). In a dry run the very same write made before is answered from memory, and
        one to an object only the dry run created is worked out there (see
        `nodeagent.kube.dryrun`)."""
        dry = self.dry_run
        key = None
        if dry is not None:
            key = dry.key(method, path, params, body)
            answer = dry.answered(key)
            if answer is not None:
                return answer, False
        try:
            data = await self.request(
                method,
                path,
                params=params,
                body=body,
                content_type=content_type,
                verb=verb,
                resource=resource.plural,
                idempotent=idempotent,
            )
        except errors.NotFound:
            if dry is None or key is None or not name:
                raise
            worked_out = dry.unstored_write(
                verb, resource, namespace, name, method, body, content_type
            )
            if worked_out is None:
                raise
            dry.remember(key, worked_out)
            return worked_out, False
        if dry is not None and key is not None:
            dry.remember(key, data)
        return data, True

    async def _record(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str,
        would: bytes | None,
        *,
        current: bool = True,
    ) -> None:
        """Records a dry-run write with the object as the cluster holds it (read now: the
        dry run changed nothing)."""
        assert self.dry_run is not None
        held: bytes | None = None
        if current and name:
            try:
                held = await self.get(resource, name, namespace)
            except errors.NotFound:
                held = None
            except errors.KubeError as exc:
                # The write is still recorded; its diff is then against nothing.
                log.warning(
                    "dry run: the object as the cluster holds it could not be read",
                    resource=resource.plural,
                    name=name,
                    error=str(exc),
                )
        self.dry_run.record(verb, resource, namespace, name, would, held)

    def _record_collection(self, resource: Resource, namespace: str | None, data: bytes) -> None:
        assert self.dry_run is not None
        try:
            items = msgspec.json.decode(data, type=_RawList).items or []
        except (msgspec.DecodeError, msgspec.ValidationError):
            return
        for raw in items:
            item = bytes(raw)
            meta = _head_decoder.decode(item).metadata
            remaining = item if _still_exists(item) else None
            self.dry_run.record("delete", resource, namespace, meta.name, remaining, item)

    def _written(self, resource: Resource, verb: Verb, namespace: str | None, data: bytes) -> None:
        if self._observing:
            try:
                meta = _head_decoder.decode(data).metadata
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning(
                    "write answer is not an object", resource=resource.plural, error=str(exc)
                )
                return
            self._notify(resource, verb, meta.namespace or namespace, meta.name, data)

    async def create(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        into: type[T] = RAW,
    ) -> T:
        """POST a new object (``metadata.generateName`` works: the answer carries the name)."""
        data, fresh = await self._write(
            resource,
            "POST",
            resource.path(namespace),
            encode_body(obj),
            verb="create",
            idempotent=False,
        )
        if fresh and self.dry_run is not None:
            await self._record("create", resource, namespace, "", data, current=False)
        self._written(resource, "create", namespace, data)
        return _decode(data, into)

    async def update(
        self,
        resource: Resource,
        obj: Body,
        namespace: str | None = None,
        *,
        into: type[T] = RAW,
        subresource: str | None = None,
    ) -> T:
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
        data, fresh = await self._write(
            resource,
            "PUT",
            resource.path(namespace, meta.name, subresource),
            body,
            verb="update",
            namespace=namespace,
            name=meta.name,
        )
        if fresh and self.dry_run is not None:
            await self._record("update", resource, namespace, meta.name, data)
        self._written(resource, "update", namespace, data)
        return _decode(data, into)

    async def patch(
        self,
        resource: Resource,
        name: str,
        patch: Body | builtins.list[Any],
        namespace: str | None = None,
        *,
        into: type[T] = RAW,
        type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool = False,
        subresource: str | None = None,
    ) -> T:
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
        into: type[T],
        type: PatchType,
        field_manager: str | None,
        force: bool,
        subresource: str | None,
    ) -> T:
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
        data, fresh = await self._write(
            resource,
            "PATCH",
            resource.path(namespace, name, subresource),
            body,
            params=params,
            content_type=_PATCH_CONTENT_TYPES[type],
            verb="patch",
            # A JSON patch may add to a list: repeating it after a lost answer is not safe.
            idempotent=type != "json",
            namespace=namespace,
            name=name,
        )
        if fresh and self.dry_run is not None:
            await self._record("patch", resource, namespace, name, data)
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
        into: type[T] = RAW,
    ) -> T:
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
        data, fresh = await self._write(
            resource,
            "DELETE",
            resource.path(namespace, name),
            _delete_options(uid, resource_version, propagation_policy, grace_period_seconds),
            verb="delete",
            namespace=namespace,
            name=name,
        )
        remaining = data if _still_exists(data) else None
        if fresh and self.dry_run is not None:
            await self._record("delete", resource, namespace, name, remaining)
        if self._observing:
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
        data, fresh = await self._write(
            resource,
            "DELETE",
            resource.path(namespace),
            _delete_options(None, None, propagation_policy, None),
            params=selector_params(label_selector, field_selector),
            verb="deletecollection",
        )
        if fresh and self.dry_run is not None:
            self._record_collection(resource, namespace, data)
        if not self._observing:
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
