"""A model of the driver's prepared claims: prepares, unprepares, failures and restarts.

The kubelet may repeat any call, in any order, across driver restarts; the driver must keep
three things in step whatever happens: the checkpoint, the CDI spec files and its answers.
Hypothesis drives the real `KubeletDriver` (the real checkpoint store and CDI writer in a temp
directory; only the API server is a dict) against a model: the set of prepared claims.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nodeagent.kube import NotFound
from nodeagent.sdk import Claim, ClaimRef, ContainerEdits, KubeletPlugin, PreparedDevice
from nodeagent.sdk.cdi import spec_file_name
from nodeagent.sdk.kubelet import KubeletDriver

DRIVER = "gpu.example.com"
KIND = f"k8s.{DRIVER}/device"
UIDS = [f"{i}0000000-0000-4000-8000-00000000000{i}" for i in range(4)]


class FakeClaims:
    """The API server's ResourceClaims: name -> (uid, allocated)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[str, bool]] = {}
        self.reads = 0

    async def get(self, resource: Any, name: str, namespace: str | None = None) -> bytes:
        self.reads += 1
        if name not in self.objects:
            raise NotFound(404, "NotFound", f'resourceclaims "{name}" not found')
        uid, allocated = self.objects[name]
        status = (
            {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": DRIVER,
                                "pool": "node-a",
                                "device": f"gpu-{name}",
                            }
                        ]
                    }
                }
            }
            if allocated
            else {}
        )
        return json.dumps(
            {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "status": status}
        ).encode()


class PreparedClaimsModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp())
        self.api = FakeClaims()
        self.fail_prepare = False
        self.fail_unprepare = False
        self.prepare_calls = 0
        self.prepared: set[str] = set()  # the model: UIDs prepared
        self.driver = self._start()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    async def _prepare(self, claim: Claim) -> Sequence[PreparedDevice]:
        self.prepare_calls += 1
        if self.fail_prepare:
            raise RuntimeError("busy")
        return [PreparedDevice(d, ContainerEdits(env={"GPU": d.device})) for d in claim.devices]

    async def _unprepare(self, ref: ClaimRef, devices: Sequence[PreparedDevice]) -> None:
        if self.fail_unprepare:
            raise RuntimeError("stuck")

    def _start(self) -> KubeletDriver:
        options = KubeletPlugin(
            prepare=self._prepare, unprepare=self._unprepare, cdi_dir=str(self.dir / "cdi")
        )
        driver = KubeletDriver(DRIVER, options, str(self.dir / "plugin"), self.api)  # type: ignore[arg-type]
        driver.load()
        return driver

    def _ref(self, i: int) -> ClaimRef:
        return ClaimRef("ns", f"c{i}", UIDS[i])

    @rule(i=st.integers(0, 3), allocated=st.booleans())
    def create_claim(self, i: int, allocated: bool) -> None:
        self.api.objects[f"c{i}"] = (UIDS[i], allocated)

    @rule(i=st.integers(0, 3))
    def delete_claim(self, i: int) -> None:
        self.api.objects.pop(f"c{i}", None)

    @rule(fail=st.booleans())
    def author_prepare_fails(self, fail: bool) -> None:
        self.fail_prepare = fail

    @rule(fail=st.booleans())
    def author_unprepare_fails(self, fail: bool) -> None:
        self.fail_unprepare = fail

    @rule(claims=st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
    def prepare(self, claims: list[int]) -> None:
        calls = self.prepare_calls
        answer = trio.run(self.driver.prepare_claims, [self._ref(i) for i in claims])
        assert set(answer) == {UIDS[i] for i in claims}  # every claim has an entry
        fresh = 0
        for i in claims:
            uid, outcome = UIDS[i], answer[UIDS[i]]
            stored = self.api.objects.get(f"c{i}")
            if uid in self.prepared:  # from the checkpoint, whatever the API or author says
                assert outcome.error == ""
                continue
            can = stored is not None and stored == (uid, True)
            if can:
                fresh += 1
            if can and not self.fail_prepare:
                assert outcome.error == "", outcome.error
                (device,) = outcome.devices
                assert device[3] == (f"{KIND}={uid}-gpu-c{i}",)
                self.prepared.add(uid)
            else:
                assert outcome.error != "" and outcome.devices == ()
        assert self.prepare_calls - calls == fresh  # the callback ran for new claims only

    @rule(claims=st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
    def unprepare(self, claims: list[int]) -> None:
        answer = trio.run(self.driver.unprepare_claims, [self._ref(i) for i in claims])
        assert set(answer) == {UIDS[i] for i in claims}
        for i in claims:
            uid = UIDS[i]
            if uid in self.prepared and self.fail_unprepare:
                assert answer[uid].error == f"unprepare ns/c{i}: stuck"
            else:
                assert answer[uid].error == ""
                self.prepared.discard(uid)

    @rule()
    def restart(self) -> None:
        self.driver = self._start()

    @precondition(lambda self: bool(self.prepared))
    @rule()
    def runtime_dir_wiped(self) -> None:
        """A reboot cleans /var/run/cdi; the checkpoint (under /var/lib) stays."""
        shutil.rmtree(self.dir / "cdi", ignore_errors=True)
        for uid in sorted(self.prepared):  # the kubelet prepares them again after the reboot
            i = UIDS.index(uid)
            answer = trio.run(self.driver.prepare_claims, [self._ref(i)])
            assert answer[uid].error == ""

    @invariant()
    def driver_state_is_the_model(self) -> None:
        assert set(self.driver.prepared) == self.prepared

    @invariant()
    def checkpoint_is_the_model(self) -> None:
        reader = KubeletDriver(DRIVER, self.driver.options, str(self.dir / "plugin"), None)
        reader.load()
        assert set(reader.prepared) == self.prepared

    @invariant()
    def a_spec_per_prepared_claim(self) -> None:
        cdi = self.dir / "cdi"
        files = {p.name for p in cdi.glob("*.json")} if cdi.exists() else set()
        assert files == {spec_file_name(KIND, u) for u in self.prepared}


TestPreparedClaims = PreparedClaimsModel.TestCase
