# Sourced by scripts/setup, scripts/check and scripts/test: where cargo and the Rust build are.
# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
# Keep the Rust build between runs, one build directory per checkout (keyed by its path). Two
# checkouts sharing one directory got each other's extension: the cdylib's file name carries no
# hash, so the last one built overwrites it, and the other's fingerprint still says fresh, so its
# next `scripts/setup` installs the other checkout's code without a rebuild.
_nodeagent_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
_nodeagent_key=$(printf %s "$_nodeagent_root" | sha256sum | cut -c1-12)
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/cargo-target/$_nodeagent_key}
unset _nodeagent_root _nodeagent_key
