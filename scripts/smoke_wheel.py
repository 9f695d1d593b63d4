"""Smoke-test a built nodeagent wheel as a user installs it: a clean virtualenv per interpreter.

For every `--python`: a new venv (no pip of its own: the tools venv's pip installs into it with
`pip --python`), the wheel installed with its dependencies from the package index (not the
editable tree), then
  - `nodeagent --version` prints the wheel's version, which is rust/Cargo.toml's;
  - `nodeagent check-config` prints the defaults (exit 0) and names a bad field (exit 2);
  - `nodeagent run` standalone reaches READY=1 on a notify socket and /readyz answers 200, and
    SIGTERM stops it cleanly (STOPPING=1, exit 0, no traceback);
  - the plugin path on that interpreter: an SDK reporter plugin served and dialled through the
    gRPC bridge (GetInfo, a registration status, a list-and-watch stream), and neither
    trio-asyncio nor greenlet in the venv.
For every `--refused` interpreter pip must refuse the wheel with its Requires-Python message.
With `--emulated`, `--python` is another architecture's interpreter run under qemu-user: the
extension's results and the standalone run are checked there. With `--run-script-clone`,
README's `bash scripts/run` is started in that fresh clone: it must install and reach READY.

Standard library only: it runs under any python3, outside the project's venvs.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60.0
# The Rust extension's results, identical on every architecture.
NATIVE_CHECK = """
from nodeagent import _native as n
assert n.quantity_parse("1500m") == (1500000000, "DecimalSI")
assert n.quantity_canonical("2048Mi") == "2Gi"
assert n.quantity_cmp("1Gi", "1G") > 0
print("ok")
"""
# The gRPC bridge both ways (the SDK serving, the agent's side dialling) in one process.
BRIDGE_CHECK = """
import importlib.util, sys, tempfile, trio
from nodeagent.protos.pluginregistration.v1 import api_grpc as reg_grpc, api_pb2 as reg
from nodeagent.protos.reporterplugin.v1alpha1 import api_grpc as rep_grpc, api_pb2 as rep
from nodeagent.rpc import open_grpc_bridge
from nodeagent.sdk import ReporterPlugin, ReportItem

assert importlib.util.find_spec("trio_asyncio") is None, "trio-asyncio installed"
assert importlib.util.find_spec("greenlet") is None, "greenlet installed"

async def main(directory):
    item = ReportItem(group="g", version="v1alpha1", kind="K", field_type="Status",
                      field_name="f", value={"n": 1})
    with trio.fail_after(30):
        async with open_grpc_bridge() as bridge, ReporterPlugin.serve(
            name="smoke", registry_dir=directory, bridge=bridge
        ) as plugin, bridge.channel(plugin.socket_path) as channel:
            await plugin.report([item])
            info = await bridge.unary(
                channel.stub(reg_grpc.RegistrationStub).GetInfo, reg.InfoRequest(), timeout=5
            )
            assert (info.type, info.name) == ("ReporterPlugin", "smoke"), info
            await bridge.unary(
                channel.stub(reg_grpc.RegistrationStub).NotifyRegistrationStatus,
                reg.RegistrationStatus(plugin_registered=True), timeout=5,
            )
            assert plugin.registered
            method = channel.stub(rep_grpc.ReporterPluginStub).ListAndWatchReportContent
            async with bridge.server_stream(method, rep.Empty()) as replies:
                async for message in replies:
                    assert message.content[0].field[0].fieldName == "f", message
                    break
    print("ok")

with tempfile.TemporaryDirectory(prefix="na-smoke-") as directory:
    trio.run(main, directory)
"""
STOP_TIMEOUT = 30.0
INSTALL_TIMEOUT = 900.0  # scripts/run's first start builds the Rust extension


def wheel_version(wheel: Path) -> tuple[str, str]:
    """(Version, Requires-Python) from the wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        headers = archive.read(name).decode().split("\n\n", 1)[0]
    fields = dict(line.split(": ", 1) for line in headers.splitlines() if ": " in line)
    return fields["Version"], fields["Requires-Python"]


def cargo_version() -> str:
    with (ROOT / "rust" / "Cargo.toml").open("rb") as f:
        return str(tomllib.load(f)["package"]["version"])


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, check=False, env=env)


def expect(ok: bool, what: str, detail: object = "") -> None:
    if not ok:
        raise SystemExit(f"smoke: FAILED: {what}\n{detail}")


def clean_env(home: Path) -> dict[str, str]:
    """No cluster (standalone), no inherited systemd variables, a home of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            ("NOTIFY_", "WATCHDOG_", "JOURNAL_", "KUBERNETES_", "VIRTUAL_ENV", "PYTHON")
        )
        and k != "KUBECONFIG"
    }
    env["HOME"] = str(home)
    return env


class Notify:
    """The systemd side of sd_notify: a datagram socket collecting the agent's messages."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.seen: list[dict[str, str]] = []

    def wait_for(self, key: str, timeout: float) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            for fields in self.seen:
                if fields.get(key) == "1":
                    return fields
            self.sock.settimeout(left)
            try:
                data = self.sock.recv(65536).decode()
            except TimeoutError:
                break
            self.seen.append(dict(f.split("=", 1) for f in data.split("\n") if "=" in f))
        raise SystemExit(f"smoke: FAILED: no {key}=1 within {timeout}s; got {self.seen}")


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def smoke_run(nodeagent_run: list[str], work: Path, env: dict[str, str], timeout: float) -> float:
    """Run standalone to READY and /readyz 200, then SIGTERM; returns seconds to READY."""
    notify = Notify(work / "notify")
    stderr_path = work / "run.stderr"
    config = work / "config.toml"  # an empty file: defaults, whatever /etc/nodeagent holds
    config.write_text("")
    command = [*nodeagent_run, "--config", str(config), "--state-dir", str(work / "state")]
    command += ["--ops-address", "127.0.0.1:0"]
    started = time.monotonic()
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            command,
            env={**env, "NOTIFY_SOCKET": notify.path},
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        ready = notify.wait_for("READY", timeout)
        to_ready = time.monotonic() - started
        match = re.search(r"ops on (\S+)", ready.get("STATUS", ""))
        expect(match is not None, "READY's STATUS names the ops address", ready)
        assert match is not None
        deadline = time.monotonic() + timeout
        while (status := http_status(f"http://{match.group(1)}/readyz")) != 200:
            expect(time.monotonic() < deadline, "/readyz answers 200", status)
            time.sleep(0.2)  # polling a condition with a deadline
        proc.send_signal(signal.SIGTERM)
        notify.wait_for("STOPPING", STOP_TIMEOUT)
        rc = proc.wait(timeout=STOP_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        notify.sock.close()
    log = stderr_path.read_text()
    expect(rc == 0, f"SIGTERM stops with exit 0, got {rc}", log)
    expect("Traceback" not in log, "no traceback on stderr", log)
    return to_ready


# (the interpreter, `nodeagent`, environment variables they need)
Commands = tuple[list[str], list[str], dict[str, str]]


def install_native(tools_python: str, python: str, wheel: Path, work: Path) -> Commands:
    """A clean venv of `python` with the wheel and its dependencies."""
    venv = work / "venv"
    made = run([python, "-m", "venv", "--without-pip", str(venv)])
    expect(made.returncode == 0, f"{python} -m venv", made.stderr)
    target = str(venv / "bin" / "python")
    installed = run([tools_python, "-m", "pip", "--python", target, "install", "-q", str(wheel)])
    expect(installed.returncode == 0, f"pip install {wheel.name}", installed.stderr)
    return [target], [str(venv / "bin" / "nodeagent")], {}


def install_emulated(tools_python: str, python: str, wheel: Path, work: Path) -> Commands:
    """`python` of another architecture under qemu-user, rooted at its unpacked Debian tree
    (python = <root>/usr/bin/python3.X): the wheel and its dependencies for that platform
    installed into a directory on its PYTHONPATH (pip cannot run under emulation fast enough)."""
    root = Path(python).parents[2]
    probe = "import platform, sys; print(platform.machine(), *sys.version_info[:2])"
    qemu = [f"qemu-{wheel.stem.split('manylinux_2_28_')[-1]}-static", "-L", str(root), python]
    machine, major, minor = run([*qemu, "-c", probe]).stdout.split()
    site = work / "site"
    install = [tools_python, "-m", "pip", "install", "-q", "--target", str(site)]
    install += ["--platform", f"manylinux_2_28_{machine}", "--python-version", f"{major}.{minor}"]
    install += ["--implementation", "cp", "--only-binary=:all:", str(wheel)]
    installed = run(install)
    expect(installed.returncode == 0, f"pip install {wheel.name} for {machine}", installed.stderr)
    return qemu, [*qemu, "-m", "nodeagent"], {"PYTHONPATH": str(site)}


def smoke(tools_python: str, python: str, wheel: Path, version: str, emulated: bool) -> None:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="nodeagent-smoke-") as tmp:
        work = Path(tmp)
        install = install_emulated if emulated else install_native
        interpreter, nodeagent, extra_env = install(tools_python, python, wheel, work)
        env = {**clean_env(work), **extra_env}
        probe = [*interpreter, "-c", "import sys; print(sys.version.split()[0])"]
        implementation = run(probe, env=env)
        if emulated:
            # --version and check-config are pure Python, proven natively: here the other
            # architecture's extension is exercised, and `run` shows the version in its log.
            exercised = run([*interpreter, "-c", NATIVE_CHECK], env=env)
            expect(exercised.stdout.strip() == "ok", "the extension works", exercised)
        else:
            shown = run([*nodeagent, "--version"], env=env)
            expect(shown.stdout.strip() == f"nodeagent {version}", "--version", shown)

            state = ["--state-dir", str(work / "state")]
            checked = run([*nodeagent, "check-config", "--config", "/nonexistent", *state], env=env)
            expect(
                checked.returncode == 2 and "/nonexistent" in checked.stderr,
                "missing file",
                checked,
            )
            checked = run([*nodeagent, "check-config", *state], env=env)
            expect(checked.returncode == 0 and "[agent]" in checked.stdout, "check-config", checked)
            bridged = run([*interpreter, "-c", BRIDGE_CHECK], env=env)
            expect(bridged.stdout.strip() == "ok", "an SDK plugin over the gRPC bridge", bridged)
            bad = ["--set", "plugins.scan_interval=fast"]
            checked = run([*nodeagent, "check-config", *state, *bad], env=env)
            expect(
                checked.returncode == 2 and "plugins.scan_interval" in checked.stderr,
                "check-config names the bad field",
                checked,
            )

        timeout = START_TIMEOUT * (3 if emulated else 1)
        to_ready = smoke_run([*nodeagent, "run"], work, env, timeout)
        logged = (work / "run.stderr").read_text()
        expect(f"version={version}" in logged, "run logs the version", logged)
    checks = "the extension's results" if emulated else "--version, check-config, gRPC bridge"
    print(
        f"smoke: {wheel.name} on CPython {implementation.stdout.strip()} "
        f"({'emulated, ' if emulated else ''}{python}): installed, {checks}, "
        f"READY in {to_ready:.1f}s, SIGTERM -> 0; {time.monotonic() - started:.1f}s in all"
    )


def refused(tools_python: str, python: str, wheel: Path, requires: str) -> None:
    with tempfile.TemporaryDirectory(prefix="nodeagent-smoke-") as tmp:
        venv = Path(tmp) / "venv"
        made = run([python, "-m", "venv", "--without-pip", str(venv)])
        expect(made.returncode == 0, f"{python} -m venv", made.stderr)
        target = str(venv / "bin" / "python")
        attempt = run([tools_python, "-m", "pip", "--python", target, "install", str(wheel)])
        interpreter = run([target, "-c", "import sys; print(sys.version.split()[0])"]).stdout
    expect(
        attempt.returncode != 0 and "requires a different Python" in attempt.stderr,
        f"pip refuses the wheel on {python} (Requires-Python {requires})",
        attempt.stdout + attempt.stderr,
    )
    print(f"smoke: CPython {interpreter.strip()} ({python}): refused by pip ({requires})")


def run_script(clone: Path, version: str) -> None:
    """README's Quick start, `bash scripts/run`, in a fresh clone: it makes its venv, installs
    the checkout and runs the agent to READY; a second start reuses the install."""
    with tempfile.TemporaryDirectory(prefix="nodeagent-smoke-") as tmp:
        work = Path(tmp)
        # The user's own home (cargo, rustup and their caches), nothing else inherited.
        env = {**clean_env(work), "HOME": os.environ["HOME"]}
        script = ["bash", str(clone / "scripts" / "run")]
        (work / "first").mkdir()
        (work / "second").mkdir()
        first = smoke_run(script, work / "first", env, INSTALL_TIMEOUT)
        shown = run([str(clone / ".venv-run" / "bin" / "nodeagent"), "--version"], env=env)
        expect(shown.stdout.strip() == f"nodeagent {version}", "--version", shown)
        second = smoke_run(script, work / "second", env, START_TIMEOUT)
    print(
        f"smoke: bash scripts/run in a fresh clone: venv + install + READY in {first:.1f}s, "
        f"SIGTERM -> 0; again (installed): READY in {second:.1f}s"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--wheel", type=Path, required=True)
    parser.add_argument("--tools-python", required=True, help="a python with a recent pip")
    parser.add_argument("--python", action="append", default=[], help="must install and run")
    parser.add_argument("--refused", action="append", default=[], help="pip must refuse")
    parser.add_argument("--run-script-clone", type=Path, help="a fresh clone to run scripts/run in")
    parser.add_argument(
        "--emulated", action="store_true", help="--python is another architecture's (qemu-user)"
    )
    args = parser.parse_args()

    version, requires = wheel_version(args.wheel)
    expect(version == cargo_version(), "wheel version is rust/Cargo.toml's", version)
    for python in args.python:
        smoke(args.tools_python, python, args.wheel, version, args.emulated)
    for python in args.refused:
        refused(args.tools_python, python, args.wheel, requires)
    if args.run_script_clone:
        run_script(args.run_script_clone, version)
    return 0


if __name__ == "__main__":
    sys.exit(main())
