#!/usr/bin/env bash
# Install, when missing, the Debian packages that build and run the image:
#   mmdebstrap, umoci     deploy/image/build.sh
#   podman, runc          tests/deploy/test_image.py (runc, not crun: crun refuses the hybrid
#                         cgroup v1/v2 hierarchy of machines like CI's)
# A second run changes nothing; apt keeps the downloaded debs in /var/cache/apt/archives.
set -euo pipefail
need=()
for tool in "$@"; do
  command -v "$tool" >/dev/null || need+=("$tool")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} (apt)" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
