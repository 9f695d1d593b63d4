# The shared body of the tests' Go builds (tests/harness/*/build.sh source this file): find Go,
# key a cache directory by the build's inputs, print the cached binary's path, or build it (one
# build at a time per directory) and print its path, always on the last line of stdout.
#
# The key is the hash of the source files a build.sh names and of its `go build` command line
# (flags, package, environment): what decides the binary, not the text of the scripts, so editing
# a script without changing what it builds keeps its cache. The files are hashed by content and
# named relative to the build's directory (and -trimpath keeps paths out of the binary), so the
# checkout's path is in neither: a fresh clone anywhere finds the same cache.
#
# Needs only Go and the Go module proxy. Uses the default GOCACHE/GOMODCACHE so Go's own caches
# are shared across the builds and across clones.
#   GO                       the Go toolchain (default: `go` on PATH, then /usr/local/go/bin/go)
#   NODEAGENT_HARNESS_CACHE  overrides the cache root
#                            (default ${XDG_CACHE_HOME:-$HOME/.cache}/nodeagent)

gobuild_find_go() {
  GO="${GO:-}"
  if [[ -z "$GO" ]]; then
    if command -v go >/dev/null 2>&1; then
      GO="$(command -v go)"
    elif [[ -x /usr/local/go/bin/go ]]; then
      GO=/usr/local/go/bin/go
    else
      echo "build.sh: no Go toolchain found (set GO=/path/to/go)" >&2
      exit 1
    fi
  fi
}

# gobuild NAME PREFIX DESCRIPTION SOURCES -- [VAR=VALUE...] GO_BUILD_ARGS...
#   NAME         the binary's file name in its cache directory
#   PREFIX       the cache directory's name before the key ("draplugin", "apiserver-harness-1.37")
#   DESCRIPTION  what is built, for the log ("helm v3.19.0 (Kubernetes 1.37)")
#   SOURCES      the files whose content keys the cache, one word each
#   after --     the environment and the arguments of `go build` (-o goes first)
gobuild() {
  local name=$1 prefix=$2 description=$3 sources=$4
  shift 4
  [[ "${1:-}" == -- ]] && shift
  local -a env=() args=()
  while [[ $# -gt 0 && "$1" == [A-Z_]*=* ]]; do
    env+=("$1")
    shift
  done
  args=("$@")
  gobuild_find_go
  local key
  # shellcheck disable=SC2086  # SOURCES is a list of words
  key="$({ cat $sources; printf '%s\n' "${env[@]}" -- "${args[@]}"; } | sha256sum | cut -c1-16)"
  local root="${NODEAGENT_HARNESS_CACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/nodeagent}"
  local outdir="$root/$prefix-$key"
  local bin="$outdir/$name"
  if [[ -x "$bin" ]]; then
    echo "$bin"
    return 0
  fi
  mkdir -p "$outdir"
  # Concurrent builds of one binary (tests started together) wait for the first one instead of
  # compiling the same packages side by side on a shared machine.
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$outdir/.lock"
    flock 9
    if [[ -x "$bin" ]]; then
      echo "$bin"
      return 0
    fi
  fi
  local tmp
  tmp="$(mktemp "$outdir/$name.XXXXXX")"
  # shellcheck disable=SC2064  # the path is fixed now
  trap "rm -f '$tmp'" EXIT
  echo "build.sh: building $description -> $bin" >&2
  local start
  start=$(date +%s)
  env "${env[@]}" "$GO" build -o "$tmp" "${args[@]}" >&2
  mv -f "$tmp" "$bin"
  trap - EXIT
  echo "build.sh: built in $(($(date +%s) - start))s" >&2
  echo "$bin"
}
