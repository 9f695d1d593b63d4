"""One-layer OCI-layout image tars for the real-node tests, built from Debian's static busybox
(tests/harness/realnode/build-runtime.sh puts it beside containerd): no container registry is
reachable from these machines, so the pause image and the test image are written here and loaded
with ``ctr -n k8s.io images import``. Standard library only; the tars are byte-for-byte
repeatable."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import pathlib
import subprocess
import tarfile
from collections.abc import Sequence

__all__ = ["BUSYBOX_IMAGE", "PAUSE_IMAGE", "write_image", "write_images"]

# containerd's default sandbox image (also pinned in realnode's containerd config).
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
BUSYBOX_IMAGE = "localhost/busybox:e2e"
# Exits at once on SIGTERM (the kubelet stops sandboxes with it), sleeps otherwise.
PAUSE_ENTRYPOINT = (
    "/bin/sh",
    "-c",
    'trap "exit 0" TERM INT; while :; do sleep 3600 & wait $!; done',
)

_MTIME = 0


def _blob(data: bytes) -> tuple[str, int]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def _layer(busybox: pathlib.Path) -> bytes:
    """An uncompressed tar: /bin/busybox, a symlink per applet, /etc/passwd and /etc/group."""
    applets = subprocess.run(
        [str(busybox), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(
            name: str, kind: bytes, data: bytes = b"", mode: int = 0o755, link: str = ""
        ) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.mtime, info.linkname = kind, mode, _MTIME, link
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)

        for d in ("bin", "etc", "tmp", "proc", "sys", "dev", "var", "root"):
            add(d, tarfile.DIRTYPE, mode=0o1777 if d == "tmp" else 0o755)
        add("bin/busybox", tarfile.REGTYPE, busybox.read_bytes())
        for applet in sorted(set(applets) - {"busybox"}):
            add(f"bin/{applet}", tarfile.SYMTYPE, link="busybox", mode=0o777)
        add("etc/passwd", tarfile.REGTYPE, b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        add("etc/group", tarfile.REGTYPE, b"root:x:0:\n", 0o644)
    return buf.getvalue()


def write_image(
    out: pathlib.Path, name: str, busybox: pathlib.Path, entrypoint: Sequence[str] = ("/bin/sh",)
) -> pathlib.Path:
    """Write an OCI-layout tar of image ``name`` (its ``io.containerd.image.name`` annotation)
    to ``out``: one layer (see :func:`_layer`), ``entrypoint``, PATH=/bin. Returns ``out``."""
    layer = _layer(busybox)
    layer_gz = gzip.compress(layer, mtime=_MTIME)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": list(entrypoint), "Env": ["PATH=/bin"]},
            "rootfs": {"type": "layers", "diff_ids": [_blob(layer)[0]]},
        },
        sort_keys=True,
    ).encode()
    blobs: dict[str, bytes] = {}

    def descriptor(media_type: str, data: bytes) -> dict[str, object]:
        digest, size = _blob(data)
        blobs[digest] = data
        return {"mediaType": media_type, "digest": digest, "size": size}

    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": descriptor("application/vnd.oci.image.config.v1+json", config),
            "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer_gz)],
        },
        sort_keys=True,
    ).encode()
    index_entry = descriptor("application/vnd.oci.image.manifest.v1+json", manifest)
    index_entry["platform"] = {"architecture": "amd64", "os": "linux"}
    index_entry["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
    }
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [index_entry],
        },
        sort_keys=True,
    ).encode()
    files = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    files.update({f"blobs/sha256/{d.removeprefix('sha256:')}": b for d, b in blobs.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, _MTIME
            tar.addfile(info)
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, _MTIME
            tar.addfile(info, io.BytesIO(data))
    return out


def write_images(outdir: pathlib.Path, busybox: pathlib.Path) -> dict[str, pathlib.Path]:
    """The pause image and the test image (:data:`BUSYBOX_IMAGE`, entrypoint /bin/sh) as tars
    in ``outdir``: image name -> tar path."""
    return {
        PAUSE_IMAGE: write_image(outdir / "pause.tar", PAUSE_IMAGE, busybox, PAUSE_ENTRYPOINT),
        BUSYBOX_IMAGE: write_image(outdir / "busybox.tar", BUSYBOX_IMAGE, busybox),
    }
