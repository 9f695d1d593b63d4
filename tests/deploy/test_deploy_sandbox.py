"""The agent at run time inside the shipped unit's sandbox, without systemd as PID 1:
`systemd-analyze` checks the unit's text; this runs `nodeagent run` under the same kernel
restrictions and shows it still does its job (READY, a real plugin registered and streamed,
its devices served, a clean stop).

Applied here as systemd applies them (the unit's own lines are read, so the test follows the unit):
- `CapabilityBoundingSet=` + `AmbientCapabilities=` + `NoNewPrivileges=yes`: `setpriv` empties the
  bounding, inheritable and ambient sets and sets no_new_privs, so root runs with no capability;
- `SystemCallFilter=` (allow-list minus deny-list, groups expanded by `systemd-analyze
  syscall-filter`) with `SystemCallErrorNumber=EPERM`: a seccomp filter loaded through libseccomp;
- `MemoryDenyWriteExecute=yes`: `prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN)` (Linux >= 6.3), the
  kernel's own form of the rule.
Not applied: `RestrictAddressFamilies`, the filesystem and namespace settings (the unit text is
checked by `systemd-analyze` in test_deploy_systemd.py).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.deploy.test_deploy_systemd import UNIT
from tests.support.crds import REPO_ROOT
from tests.support.http import http_get

# Runs inside setpriv: loads the seccomp filter and MDWE, then execs the agent.
SANDBOX = r"""
import ctypes, errno, json, os, sys
allowed = json.loads(os.environ.pop("SANDBOX_ALLOWED_SYSCALLS"))
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    sys.exit(f"PR_SET_MDWE failed: errno {ctypes.get_errno()}")
seccomp = ctypes.CDLL("libseccomp.so.2")
seccomp.seccomp_init.restype = ctypes.c_void_p
seccomp.seccomp_init.argtypes = [ctypes.c_uint32]
seccomp.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
seccomp.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
seccomp.seccomp_load.argtypes = [ctypes.c_void_p]
SCMP_ACT_ALLOW, SCMP_ACT_ERRNO_EPERM = 0x7FFF0000, 0x00050000 | errno.EPERM
ctx = seccomp.seccomp_init(SCMP_ACT_ERRNO_EPERM)
for name in allowed:
    nr = seccomp.seccomp_syscall_resolve_name(name.encode())
    if nr >= 0 and seccomp.seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0) != 0:
        sys.exit(f"seccomp_rule_add {name} failed")
if seccomp.seccomp_load(ctx) != 0:
    sys.exit("seccomp_load failed")
os.execv(sys.executable, [sys.executable, "-m", "nodeagent", *sys.argv[1:]])
"""


def _group(name: str, seen: set[str] | None = None) -> set[str]:
    """The system calls of a `@group` (nested groups expanded), as systemd defines it."""
    seen = set() if seen is None else seen
    seen.add(name)
    out = subprocess.run(
        ["systemd-analyze", "syscall-filter", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        entry = line.strip()
        if not entry or entry.startswith("#"):
            continue
        if entry.startswith("@"):
            if entry not in seen:
                calls |= _group(entry, seen)
        else:
            calls.add(entry)
    return calls


def _expand(items: list[str]) -> set[str]:
    calls: set[str] = set()
    for item in items:
        calls |= _group(item) if item.startswith("@") else {item}
    return calls


def unit_syscall_allow_list() -> set[str]:
    """`SystemCallFilter=` lines as systemd combines them: the allow-lists' union minus every
    `~` deny-list."""
    allow: set[str] = set()
    deny: set[str] = set()
    for line in UNIT.read_text().splitlines():
        if not line.startswith("SystemCallFilter="):
            continue
        value = line.split("=", 1)[1].strip()
        if value.startswith("~"):
            deny |= _expand(value[1:].split())
        else:
            allow |= _expand(value.split())
    assert allow, "the unit has no SystemCallFilter allow-list"
    assert "EPERM" in UNIT.read_text(), "the test assumes SystemCallErrorNumber=EPERM"
    return allow - deny


def _unit_has(setting: str) -> bool:
    return any(line.strip() == setting for line in UNIT.read_text().splitlines())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _until(what: str, check: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(check) and check():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_agent_does_its_job_inside_the_units_sandbox(tmp_path: Path) -> None:
    assert _unit_has("MemoryDenyWriteExecute=yes") and _unit_has("NoNewPrivileges=yes")
    assert _unit_has("CapabilityBoundingSet=")
    allowed = unit_syscall_allow_list()
    assert "reboot" not in allowed and "setrlimit" not in allowed  # @reboot, @resources denied
    ops = f"127.0.0.1:{_free_port()}"
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is too deep for them.
    registry = Path(tempfile.mkdtemp(prefix="na-sbx-", dir="/tmp"))
    agent = subprocess.Popen(
        [
            "setpriv",
            "--bounding-set=-all",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--no-new-privs",
            "--",
            sys.executable,
            "-c",
            SANDBOX,
            "run",
            "--state-dir",
            str(tmp_path / "state"),
            "--ops-address",
            ops,
            "--registry-dir",
            str(registry),
        ],
        env={**_clean_env(), "SANDBOX_ALLOWED_SYSCALLS": json.dumps(sorted(allowed))},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    plugin: subprocess.Popen[bytes] | None = None
    try:
        _until("/readyz", lambda: http_get(ops, "/readyz")[0] == 200)
        plugin = subprocess.Popen(
            [
                sys.executable,
                str(REPO_ROOT / "examples" / "dra_device_plugin.py"),
                "--registry-dir",
                str(registry),
            ],
            stdout=subprocess.DEVNULL,
            stderr=(tmp_path / "plugin.log").open("w"),
        )

        def devices_served() -> bool:
            code, body = http_get(ops, "/v1/resourceslices")
            if code != 200:
                return False
            drivers = json.loads(body)["drivers"]
            return any(
                spec["devices"]
                for driver in drivers.values()
                for pool in driver["pools"].values()
                for spec in pool
            )

        try:
            _until("the plugin's devices on /v1/resourceslices", devices_served)
        except AssertionError as exc:
            plugin_log = (tmp_path / "plugin.log").read_text()
            raise AssertionError(f"{exc}; plugin: {plugin_log}") from None
        # The agent really runs sandboxed: no capability, no_new_privs, a seccomp filter.
        caps = Path(f"/proc/{agent.pid}/status").read_text()
        assert "CapEff:\t0000000000000000" in caps and "NoNewPrivs:\t1" in caps, caps
        assert "Seccomp:\t2" in caps, caps
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if plugin is not None:
            plugin.kill()
            plugin.wait()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        shutil.rmtree(registry, ignore_errors=True)
    assert agent.stderr is not None
    stderr = agent.stderr.read()
    assert "Traceback" not in stderr, stderr
    assert "Operation not permitted" not in stderr, stderr


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("NOTIFY_", "WATCHDOG_", "KUBERNETES_"))
    }
