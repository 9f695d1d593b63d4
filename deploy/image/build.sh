#!/usr/bin/env bash
# Build the nodeagent container image offline from packages, without any container registry:
#
#   1. the release wheel of nodeagent (scripts/build-wheels, manylinux_2_28) or the --wheel given;
#   2. its Python dependencies as wheels from PyPI, pinned in deploy/image/requirements.lock;
#   3. a root filesystem of Debian bookworm packages pinned in deploy/image/packages.lock, only
#      extracted (mmdebstrap --variant=extract: no maintainer scripts, no dpkg database, no shell);
#   4. a virtualenv /opt/nodeagent in it (the image's own python3.11), the wheels installed by a
#      pip that is copied in for the install and removed again, byte-compiled with hash-based pycs;
#   5. packed by umoci into an OCI layout with one layer, then tarred (sorted, fixed mtimes, numeric
#      owners) into an OCI archive that podman, skopeo, buildah, ctr and crane load.
#
# Every timestamp is SOURCE_DATE_EPOCH (default: the last commit's time), so two builds from the
# same inputs give the same image digest and archive bytes (tests/deploy/test_image.py checks it;
# README "Container image" says what is and is not bit-reproducible). Debs, wheels and the
# extracted base root filesystem are cached under ~/.cache/nodeagent/image/, so a second build
# downloads nothing.
#
# Usage: deploy/image/build.sh [--wheel PATH] [--out DIR] [--tag TAG] [--relock]
#   --relock: resolve the newest bookworm packages and PyPI wheels again and rewrite both lock
#   files (needed when pyproject.toml's dependencies change or bookworm drops a pinned version).
#   Output: DIR/nodeagent-oci.tar (OCI archive, named docker.io/library/nodeagent:TAG), DIR/oci,
#   DIR/rootfs (the unpacked root filesystem, for running without a container engine), and
#   DIR/image.env (DIGEST=..., TAG=..., SIZE_*=...). Default DIR is dist/image, TAG the version.
# Needs root (chroot) and Debian's mmdebstrap and umoci, which deploy/image/tools.sh installs with
# apt-get when missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cd "$repo"

wheel=""
out="$repo/dist/image"
tag=""
relock=0
while [ $# -gt 0 ]; do
  case "$1" in
    --wheel) wheel=$(realpath "$2"); shift 2 ;;
    --out) out=$(realpath -m "$2"); shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --relock) relock=1; shift ;;
    *) echo "build.sh: unknown argument $1 (expected --wheel PATH, --out DIR, --tag TAG, --relock)" >&2
       exit 2 ;;
  esac
done

if [ "$(id -u)" != 0 ]; then
  echo "build.sh: needs root (mmdebstrap --mode=root and chroot for the install)" >&2
  exit 1
fi

# The tools come from Debian's archive; CI installs them here, from scratch.
bash "$here/tools.sh" mmdebstrap umoci

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct 2>/dev/null || echo 0)}
export TZ=UTC LC_ALL=C.UTF-8
cache=${NODEAGENT_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/image}
mkdir -p "$cache/debs" "$cache/wheels" "$out"
exec 9>"$cache/build.lock"
flock 9   # one build at a time per cache (the caches are written in place)

venv=${NODEAGENT_VENV:-$repo/.venv}
[ -x "$venv/bin/python" ] || bash scripts/setup >/dev/null
work=$(mktemp -d "${TMPDIR:-/tmp}/nodeagent-image.XXXXXX")
cleanup() {
  # A chroot step interrupted leaves /proc mounted: never rm -rf into a live /proc.
  if mountpoint -q "$work/rootfs/proc"; then
    umount "$work/rootfs/proc" || umount -l "$work/rootfs/proc" || return
  fi
  rm -rf "$work"
}
trap cleanup EXIT
t0=$(date +%s)
step() { echo "[$(($(date +%s) - t0))s] $*"; }

# 1. the wheel: the release one (scripts/build-wheels: manylinux_2_28, checked by auditwheel,
# cached by a hash of the sources, so free when CI or a release has built it already)
if [ -z "$wheel" ]; then
  step "the nodeagent wheel (scripts/build-wheels)"
  # x86_64 only: the image is amd64 (NODEAGENT_WHEEL_TARGETS may say otherwise)
  NODEAGENT_WHEEL_TARGETS=${NODEAGENT_WHEEL_TARGETS:-x86_64-unknown-linux-gnu} \
    NODEAGENT_DIST="$work/dist" bash scripts/build-wheels >"$work/build-wheels.log" 2>&1 \
    || { cat "$work/build-wheels.log" >&2; exit 1; }
  wheel=$(ls "$work"/dist/nodeagent-*-manylinux_*_x86_64.whl)
fi
version=$(basename "$wheel" | cut -d- -f2)
tag=${tag:-$version}
step "wheel $(basename "$wheel")"

# 2. the dependencies, for the image's interpreter (CPython 3.11, glibc 2.36, x86_64)
platforms=()
for v in $(seq 36 -1 17); do platforms+=(--platform "manylinux_2_${v}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --only-binary=:all: --implementation cp
  --python-version 3.11)
if [ "$relock" = 1 ]; then
  step "resolving the wheel's dependencies (requirements.lock)"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --dry-run \
    --ignore-installed --target "$work/resolve" --report "$work/report.json" "${platforms[@]}" "$wheel"
  "$venv/bin/python" - "$work/report.json" "$here/requirements.lock" <<'PY'
import json
import sys

report = json.load(open(sys.argv[1]))
lines = ["# Written by deploy/image/build.sh --relock: the nodeagent wheel's dependencies for the",
         "# image (CPython 3.11, manylinux x86_64), exact versions and file hashes."]
for item in sorted(report["install"], key=lambda i: i["metadata"]["name"].lower()):
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if name == "nodeagent":
        continue
    sha = item["download_info"]["archive_info"]["hashes"]["sha256"]
    lines.append(f"{name}=={version} --hash=sha256:{sha}")
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
fi
step "dependency wheels (requirements.lock)"
"$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps \
  --require-hashes "${platforms[@]}" -r "$here/requirements.lock" -d "$cache/wheels"
mkdir -p "$work/install/wheels"
cp "$wheel" "$work/install/wheels/"
while read -r req _; do
  name=${req%%==*}; ver=${req##*==}
  norm=$(echo "$name" | tr '[:upper:]-.' '[:lower:]__')
  found=$(find "$cache/wheels" -maxdepth 1 -iname "${norm}-${ver}-*.whl" | sort | head -n 1)
  [ -n "$found" ] || { echo "build.sh: no wheel for $req in $cache/wheels" >&2; exit 1; }
  cp "$found" "$work/install/wheels/"
done < <(grep -v '^\s*\(#\|$\)' "$here/requirements.lock")

# 3. the root filesystem: only extracted packages, docs and translations left out
step "root filesystem (mmdebstrap, packages.lock)"
if [ "$relock" = 1 ]; then
  # python3.11 and the C++ runtime
  debs=(python3.11 libstdc++6)
else
  mapfile -t debs < <(grep -v '^\s*\(#\|$\)' "$here/packages.lock")
fi
# The extracted packages depend only on the lock and this script's mmdebstrap line: keep a copy.
base_key=$( (printf '%s\n' "${debs[@]}"; sed -n '/^  mmdebstrap --quiet/,/http:/p' "$here/build.sh") \
  | sha256sum | cut -c1-16)
base=$cache/rootfs-$base_key
if [ "$relock" = 0 ] && [ -d "$base" ]; then
  cp -a "$base" "$work/rootfs"
else
  mmdebstrap --quiet --mode=root --variant=extract --skip=essential/unlink \
    --include="$(IFS=,; echo "${debs[*]}")" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/lintian/*' \
    --setup-hook='mkdir -p "$1"/var/cache/apt/archives' \
    --setup-hook="sync-in $cache/debs /var/cache/apt/archives/" \
    --extract-hook="sync-out /var/cache/apt/archives $cache/debs" \
    --customize-hook='rm -f "$1"/var/cache/apt/archives/*.deb "$1"/etc/dpkg/dpkg.cfg.d/99mmdebstrap' \
    bookworm "$work/rootfs" http://deb.debian.org/debian
  rm -f "$cache/debs/lock"; rm -rf "$cache/debs/partial"
  if [ "$relock" = 0 ]; then
    rm -rf "$cache"/rootfs-*   # only the newest base is worth its 90 MB
    cp -a "$work/rootfs" "$base.tmp" && mv "$base.tmp" "$base"
  fi
fi
if [ "$relock" = 1 ]; then
  # every package the resolver chose (python3.11 and its dependencies), with its exact version
  { echo "# Written by deploy/image/build.sh --relock: the image's Debian bookworm packages, pinned."
    mmdebstrap -v --mode=root --variant=extract --include="$(IFS=,; echo "${debs[*]}")" \
      --simulate bookworm \
      /dev/null http://deb.debian.org/debian 2>&1 | sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*/\1=\2/p' \
      | sort; } >"$here/packages.lock"
  mapfile -t debs < <(grep -v '^\s*\(#\|$\)' "$here/packages.lock")
fi

# 4. the agent: a venv on the image's python, installed offline by a pip copied in for the purpose
step "virtualenv /opt/nodeagent"
root=$work/rootfs
# What mmdebstrap set up to run apt, and the build host's resolv.conf and hostname, stay out (a
# container runtime mounts its own /etc/resolv.conf, /etc/hosts, /etc/hostname and /dev).
rm -rf "$root"/etc/apt "$root"/var/cache/apt "$root"/var/lib/apt "$root"/var/log/apt \
  "$root"/etc/fstab "$root"/etc/hostname "$root"/etc/resolv.conf "$root"/dev/*
cp -a "$here/rootfs/." "$root/"   # /etc/passwd and /etc/group: root and nodeagent (65532)
# The kubelet mounts the service-account token under /var/run/secrets: /var/run is /run.
mkdir -p "$root/run" "$root/var/lib/nodeagent"
ln -sfn /run "$root/var/run"
# The default (non-root) user's state directory when no volume is mounted over it.
chown 65532:65532 "$root/var/lib/nodeagent"
chmod 0750 "$root/var/lib/nodeagent"
pip_dir=$("$venv/bin/python" -c 'import os, pip; print(os.path.dirname(os.path.dirname(pip.__file__)))')
mkdir -p "$work/install/pip"
cp -a "$pip_dir/pip" "$work/install/pip/"
mv "$work/install" "$root/tmp/install"
mkdir -p "$root/proc"
mount -t proc proc "$root/proc"
chroot "$root" /usr/bin/python3.11 -m venv --without-pip /opt/nodeagent
env -i PYTHONPATH=/tmp/install/pip SOURCE_DATE_EPOCH="$SOURCE_DATE_EPOCH" PATH=/usr/bin:/bin \
  "$(command -v chroot)" "$root" /opt/nodeagent/bin/python -m pip install --quiet --no-index \
  --no-cache-dir \
  --disable-pip-version-check --no-compile --find-links /tmp/install/wheels \
  /tmp/install/wheels/"$(basename "$wheel")"
# Hash-based pycs do not depend on mtimes; unchecked because the image is never edited in place.
chroot "$root" /usr/bin/python3.11 -m compileall -q -j 1 --invalidation-mode unchecked-hash \
  /usr/lib/python3.11 /opt/nodeagent >/dev/null
# Every extension module loads (a missing shared library shows here, not in a pod).
chroot "$root" /opt/nodeagent/bin/python -c \
  'import msgspec, multidict, yaml, google.protobuf.message, nodeagent._native'
chroot "$root" /opt/nodeagent/bin/nodeagent --version
umount "$root/proc"
rm -rf "$root/tmp/install"
# No dpkg database: what the image is made of, for scanners and people.
printf '%s\n' "${debs[@]}" >"$root/opt/nodeagent/packages.lock"
cp "$here/requirements.lock" "$root/opt/nodeagent/requirements.lock"
# Nothing for the agent to change at run time except its state (a volume) and /tmp.
chmod 1777 "$root/tmp"
find "$root" -depth -exec touch --no-dereference --date="@$SOURCE_DATE_EPOCH" {} +

# 5. the OCI image: one layer, configuration from image.conf
step "OCI image (umoci)"
layout=$work/oci
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack --image "$layout:$tag" "$work/bundle" >/dev/null
rmdir "$work/bundle/rootfs"
mv "$root" "$work/bundle/rootfs"
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci repack --image "$layout:$tag" --history.created="$created" \
  --history.created_by="deploy/image/build.sh" --history.comment="nodeagent $version" "$work/bundle"
. "$here/image.conf"
config_args=(--created="$created" --author="$IMAGE_AUTHOR" --config.user="$IMAGE_USER"
  --config.workingdir=/ --clear=config.entrypoint --clear=config.cmd --clear=config.env
  --clear=config.labels)
for e in "${IMAGE_ENTRYPOINT[@]}"; do config_args+=(--config.entrypoint="$e"); done
for c in "${IMAGE_CMD[@]}"; do config_args+=(--config.cmd="$c"); done
for e in "${IMAGE_ENV[@]}"; do config_args+=(--config.env="$e"); done
for l in "${IMAGE_LABELS[@]}" "org.opencontainers.image.version=$version" \
  "org.opencontainers.image.created=$created"; do
  config_args+=(--config.label="$l")
done
for p in "${IMAGE_VOLUMES[@]}"; do config_args+=(--config.volume="$p"); done
umoci config --image "$layout:$tag" "${config_args[@]}" --history.created="$created" \
  --history.created_by="deploy/image/build.sh (config)"
umoci gc --layout "$layout"
# The name every loader gives the image: podman load and skopeo read ref.name, containerd's import
# io.containerd.image.name; the full form is what a pod's `image: nodeagent:TAG` resolves to.
python3 - "$layout/index.json" "docker.io/library/$IMAGE_NAME:$tag" <<'PY'
import json
import sys

path, name = sys.argv[1], sys.argv[2]
index = json.load(open(path))
(manifest,) = index["manifests"]
manifest["annotations"] = {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name}
open(path, "w").write(json.dumps(index, separators=(",", ":"), sort_keys=True))
PY
chmod -R a+rX "$layout"   # umoci writes blobs 0600; anyone may read a published image

# The archive: a plain tar of the layout, byte-identical for identical layouts.
rm -rf "$out/oci" "$out/rootfs" "$out/nodeagent-oci.tar" "$out"/nodeagent-*.whl
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  --format=posix --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
  -C "$layout" -cf "$out/nodeagent-oci.tar" .
mv "$layout" "$out/oci"
mv "$work/bundle/rootfs" "$out/rootfs"
cp "$wheel" "$out/"
digest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' \
  "$out/oci/index.json")
{
  echo "IMAGE=docker.io/library/$IMAGE_NAME:$tag"
  echo "DIGEST=$digest"
  echo "ARCHIVE=$out/nodeagent-oci.tar"
  echo "SIZE_ARCHIVE=$(stat -c %s "$out/nodeagent-oci.tar")"
  echo "SIZE_ROOTFS=$(du -sb "$out/rootfs" | cut -f1)"
  echo "WHEEL=$out/$(basename "$wheel")"
  echo "SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH"
  echo "BUILD_SECONDS=$(($(date +%s) - t0))"
} >"$out/image.env"
step "done: $IMAGE_NAME:$tag $digest"
cat "$out/image.env"
