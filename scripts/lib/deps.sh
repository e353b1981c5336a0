# Shared by scripts/*.sh: install what podgate needs to build and test, only when
# it is missing. Sourced, not run.

# System packages the workspace needs: cmake (pingora's zlib-ng), redis-server
# (Redis tests run a real server), protobuf-compiler and libprotobuf-dev (tonic;
# the second holds google/protobuf/*.proto, which GitLab's agent protobufs import), libssl-dev and
# pkg-config (link the system OpenSSL instead of vendoring it), git (each simulated
# Pod serves its repository with `git http-backend`; runners clone with git),
# jq and curl (scripts/drills.sh, which a test runs in its smoke mode), prometheus
# (its server and promtool: tests/prometheus.rs checks the rules and evaluates every
# dashboard panel against a real one), chromium (tests/console drives the web console
# in headless Chromium; fonts-liberation so its screenshots have text). kubectl is
# not in Debian bookworm's archive: the tests that drive it (kube-sim, deploy/, the
# Workspaces end-to-end run) expect it installed, as on the project's machines.
PODGATE_APT_PACKAGES=(cmake redis-server protobuf-compiler libprotobuf-dev libssl-dev pkg-config git jq curl prometheus chromium fonts-liberation)

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

# kubectl cannot come from apt here (see above): say so before an hour of build.
podgate_ensure_kubectl() {
  if ! command -v kubectl >/dev/null 2>&1; then
    echo "error: kubectl not found. Install it (https://kubernetes.io/docs/tasks/tools/), then run this again: the kube-sim, deploy/ and Workspaces tests drive it." >&2
    return 1
  fi
}

# scripts/test.sh runs the tests under cargo-nextest (a process per test, every test
# binary at once); built from crates.io where the machine lacks it.
podgate_ensure_nextest() {
  if ! cargo nextest --version >/dev/null 2>&1; then
    echo "==> installing cargo-nextest"
    cargo install --locked cargo-nextest
  fi
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

# The third-party runner the acceptance test (tests/third_party_runner.rs) runs
# unchanged through `podgate up --no-fleet`: gitlab-python-runner (its job executor is
# gitlab-emulator: 1.1.9 runs its jobs; 1.4 dropped configloader.UNSUPPORTED_KEYWORDS
# and 1.5.5 helpers.debug_enabled, which 14.3.20 uses) and, to call
# `runners/verify`, a second client, gitlab-runner-api. Every package pinned, the
# transitive ones too, so the test runs the same code on every machine.
PODGATE_PY_RUNNER_PACKAGES=(
  gitlab-python-runner==14.3.20
  gitlab-emulator==1.1.9
  gitlab-runner-api==1.0.4
  requests-toolbelt==1.0.0
  PyYAML==6.0.3
  Unidecode==1.4.0
  requests==2.34.2
  urllib3==2.8.0
  idna==3.20
  charset-normalizer==3.5.2
  certifi==2026.10.18
  python-gitlab==8.6.0
  GitPython==3.2.1
  gitdb==4.0.12
  smmap==5.0.3
  docker==7.2.0
  colorlog==6.12.0
  six==1.17.0
  # gitlab-runner-api imports pkg_resources
  setuptools==70.0.0
)

# Creates the venv at $PODGATE_PY_RUNNER_VENV (default target/py-runner-venv) with the
# pins above, unless it already holds exactly them, and exports PODGATE_PY_RUNNER_VENV
# for the test. Needs python3 with venv (installed through apt-get when missing).
podgate_ensure_py_runner() {
  local venv="${PODGATE_PY_RUNNER_VENV:-$PWD/target/py-runner-venv}"
  local stamp="$venv/podgate-pins.txt"
  local want
  want="$(printf '%s\n' "${PODGATE_PY_RUNNER_PACKAGES[@]}")"
  export PODGATE_PY_RUNNER_VENV="$venv"
  if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    return 0
  fi
  if ! python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
    PODGATE_APT_PACKAGES+=(python3 python3-venv)
    podgate_ensure_system_packages
  fi
  echo "==> creating the third-party runner's venv in $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${PODGATE_PY_RUNNER_PACKAGES[@]}"
  printf '%s\n' "$want" > "$stamp"
}
