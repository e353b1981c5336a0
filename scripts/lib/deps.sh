# Shared by scripts/*.sh: install what podgate needs to build and test, only when
# it is missing. Sourced, not run.

# System packages the workspace needs: cmake (pingora's zlib-ng), redis-server
# (Redis tests run a real server), protobuf-compiler (tonic), libssl-dev and
# pkg-config (link the system OpenSSL instead of vendoring it), kubectl is
# optional and only used when present.
PODGATE_APT_PACKAGES=(cmake redis-server protobuf-compiler libssl-dev pkg-config)

podgate_ensure_system_packages() {
  local missing=()
  for pkg in "${PODGATE_APT_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "==> installing missing system packages: ${missing[*]}"
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo="sudo"
    else
      echo "error: need root (or sudo) to install: ${missing[*]}" >&2
      return 1
    fi
  fi
  DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

podgate_ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo not found. Install Rust (https://rustup.rs), then run this again." >&2
    return 1
  fi
  local want=()
  cargo fmt --version >/dev/null 2>&1 || want+=(rustfmt)
  cargo clippy --version >/dev/null 2>&1 || want+=(clippy)
  if [ ${#want[@]} -gt 0 ]; then
    echo "==> adding rust components: ${want[*]}"
    rustup component add "${want[@]}"
  fi
}

# Link Debian's OpenSSL rather than building a vendored copy (minutes on 2 cores).
export OPENSSL_NO_VENDOR=1
