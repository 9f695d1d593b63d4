"""Retries, rate limiting and credential refresh, with faults injected under virtual time."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from nodeagent.kube import CONFIGMAPS, NODES, errors
from nodeagent.kube.kubeconfig import ClusterConfig, in_cluster_config
from tests.support.fake_http_apiserver import mock_client, status


class Script:
    """Answers requests from a list, recording each request and its virtual time."""

    def __init__(self, *answers: httpx.Response | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []
        self.times: list[float] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.times.append(trio.current_time())
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


OK = httpx.Response(200, json={"metadata": {"name": "x", "namespace": "ns"}})
CREATED = httpx.Response(201, json={"metadata": {"name": "x", "namespace": "ns"}})


async def test_idempotent_request_retried_until_success(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script(status(503, "ServiceUnavailable"), status(500, "InternalError"), OK)
    async with mock_client(script, retry_backoff=(1.0, 10.0)) as client:
        assert await client.get(CONFIGMAPS, "x", "ns")
    assert len(script.requests) == 3
    gaps = [b - a for a, b in zip(script.times, script.times[1:], strict=False)]
    assert 0.5 <= gaps[0] <= 1.0 and 1.0 <= gaps[1] <= 2.0  # jittered exponential backoff


async def test_retries_are_bounded(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(status(504, "Timeout", "slow etcd"))
    async with mock_client(script, max_attempts=4) as client:
        with pytest.raises(errors.ServerTimeout, match="slow etcd"):
            await client.get(CONFIGMAPS, "x", "ns")
    assert len(script.requests) == 4


async def test_429_retry_after_is_honoured(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(status(429, "TooManyRequests", **{"Retry-After": "7"}), OK)
    async with mock_client(script) as client:
        await client.get(CONFIGMAPS, "x", "ns")
    assert script.times[1] - script.times[0] == pytest.approx(7.0)


async def test_503_retry_after_is_honoured(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(status(503, "ServiceUnavailable", **{"Retry-After": "3"}), OK)
    async with mock_client(script) as client:
        await client.list(CONFIGMAPS, "ns")
    assert script.times[1] - script.times[0] == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("first", "retried"),
    [
        (status(500, "InternalError"), False),
        (status(503, "ServiceUnavailable"), False),
        (httpx.ReadError("reset after sending"), False),
        (status(429, "TooManyRequests", **{"Retry-After": "1"}), True),
        (httpx.ConnectError("refused"), True),
    ],
)
async def test_create_retried_only_if_it_provably_did_not_happen(
    autojump_clock: trio.testing.MockClock, first: httpx.Response | Exception, retried: bool
) -> None:
    script = Script(first, CREATED)
    async with mock_client(script) as client:
        if retried:
            assert await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        else:
            with pytest.raises((errors.ApiError, errors.TransportError)):
                await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
    assert len(script.requests) == (2 if retried else 1)


async def test_transport_errors_on_reads_are_retried(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script = Script(httpx.ReadError("reset"), httpx.RemoteProtocolError("eof"), OK)
    async with mock_client(script) as client:
        assert await client.get(NODES, "n")
    assert len(script.requests) == 3
    script = Script(httpx.ConnectError("refused"))
    async with mock_client(script, max_attempts=2) as client:
        with pytest.raises(errors.TransportError) as exc:
            await client.get(NODES, "n")
    assert exc.value.sent is False and "refused" in exc.value.message


async def test_per_request_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def hang(request: httpx.Request) -> httpx.Response:
        await trio.sleep(1000)
        return OK

    async with mock_client(hang, request_timeout=5, max_attempts=2) as client:
        start = trio.current_time()
        with pytest.raises(errors.TransportError, match="no answer within 5"):
            await client.get(NODES, "n")
    assert 10 <= trio.current_time() - start < 11


async def test_rate_limit_shared_by_all_requests(autojump_clock: trio.testing.MockClock) -> None:
    script = Script(OK)
    async with mock_client(script, qps=4, burst=2) as client, trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(client.get, NODES, "a")
        for _ in range(5):
            nursery.start_soon(client.list, CONFIGMAPS)
    assert len(script.times) == 10
    assert script.times[-1] - script.times[0] == pytest.approx(2.0)  # 8 over burst at 4/s


async def test_401_rereads_token_file_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("old\n")
    accepted = {"old"}
    seen: list[str] = []

    async def server(request: httpx.Request) -> httpx.Response:
        bearer = request.headers["Authorization"].removeprefix("Bearer ")
        seen.append(bearer)
        return OK if bearer in accepted else status(401, "Unauthorized", "bad token")

    cfg = ClusterConfig(server="http://kube.test", token_file=str(token))
    async with mock_client(server, cfg) as client:
        await client.get(NODES, "n")
        accepted = {"new"}  # the server stopped accepting the old token...
        token.write_text("new\n")  # ...and the file was rotated
        await client.get(NODES, "n")
        assert seen == ["old", "old", "new"]
        accepted = set()
        with pytest.raises(errors.Unauthorized, match="bad token"):
            await client.get(NODES, "n")
        assert seen[3:] == ["new", "new"]  # one fresh read, then the error


async def test_in_cluster_token_reread_every_60s(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("sa-1")
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    cfg = in_cluster_config(env, sa)
    cfg = ClusterConfig(server="http://kube.test", token_file=cfg.token_file)
    script = Script(OK)
    async with mock_client(script, cfg) as client:
        await client.get(NODES, "n")
        (sa / "token").write_text("sa-2")  # the kubelet rotated the projected token
        await trio.sleep(30)
        await client.get(NODES, "n")
        await trio.sleep(31)
        await client.get(NODES, "n")
        (sa / "token").unlink()  # mid-rotation the file may be missing: keep the last token
        await trio.sleep(61)
        await client.get(NODES, "n")
    auth = [r.headers["Authorization"] for r in script.requests]
    assert auth == ["Bearer sa-1", "Bearer sa-1", "Bearer sa-2", "Bearer sa-2"]


async def test_list_starts_over_when_continue_token_expires(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def page(names: list[str], cont: str) -> httpx.Response:
        items = [{"metadata": {"name": n}} for n in names]
        meta = {"resourceVersion": "5", "continue": cont}
        return httpx.Response(200, json={"metadata": meta, "items": items})

    script = Script(
        page(["a"], "t1"),
        status(410, "Expired", "continue token expired"),
        page(["a"], "t2"),
        page(["b"], ""),
    )
    async with mock_client(script) as client:
        result = await client.list(CONFIGMAPS, "ns", page_size=1)
    assert [b.count(b'"a"') + 2 * b.count(b'"b"') for b in result.items] == [1, 2]
    assert [r.url.params.get("continue") for r in script.requests] == [None, "t1", None, "t2"]
    assert all(r.url.params["limit"] == "1" for r in script.requests)


async def test_write_arguments_are_checked() -> None:
    async with mock_client(Script(OK)) as client:
        with pytest.raises(ValueError, match="resourceVersion is required"):
            await client.update(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        with pytest.raises(ValueError, match="field_manager"):
            await client.patch(CONFIGMAPS, "x", {}, "ns", type="apply")
        with pytest.raises(ValueError, match="force"):
            await client.patch(CONFIGMAPS, "x", {}, "ns", force=True)
        with pytest.raises(ValueError, match="cluster-scoped"):
            await client.get(NODES, "n", "ns")


async def test_write_observers_see_writes_only_while_observing() -> None:
    first: list[str] = []
    second: list[str] = []
    async with mock_client(Script(CREATED)) as client:
        with client.observe_writes(lambda e: first.append(e.verb)):
            with client.observe_writes(lambda e: second.append(e.verb)):
                await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
            await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        await client.create(CONFIGMAPS, {"metadata": {"name": "x"}}, "ns")
        assert not client._observers
    assert (first, second) == (["create", "create"], ["create"])


async def test_an_observer_that_fails_is_still_removed() -> None:
    async with mock_client(Script(CREATED)) as client:
        with (
            pytest.raises(RuntimeError, match="consumer failed"),
            client.observe_writes(lambda e: None),
        ):
            raise RuntimeError("consumer failed")
        assert not client._observers
