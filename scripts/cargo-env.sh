# Sourced by scripts/setup, scripts/check and scripts/test: where cargo and the Rust build are.
# rustup installs into ~/.cargo/bin, which a non-login shell may not have on PATH.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  export PATH="$HOME/.cargo/bin:$PATH"
fi
# Keep the Rust build between clean clones (CI clones afresh each run).
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent/cargo-target}
