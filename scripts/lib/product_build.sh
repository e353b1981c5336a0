# Shared by scripts/test.sh: the production binary's build and the feature check
# that keeps it cheap. Sourced, not run.
#
# `podgate` without its default feature `sim` is what the Dockerfile ships. Cargo
# resolves a dependency's features per build, so a third-party crate that the test
# build compiles with other features than this build is compiled twice; the root
# Cargo.toml turns those features on for this build too. A unit the product build
# compiles that the test build does not use is such a drift: its package is named,
# and the run fails, so that the minutes it costs every CI run are not paid
# silently.

# Build the product binary into target/debug/podgate-product. Fails on a compiler
# warning in podgate's own code (the workspace clippy run sees only the default
# features). Records the units it built of packages that are not workspace members
# (crates.io's and the vendored pingora) in $1.
podgate_build_product() {
  local built=$1 target=${CARGO_TARGET_DIR:-target}
  local -x LC_ALL=C
  cargo build -p podgate --bin podgate --no-default-features --locked \
    --message-format=json-render-diagnostics >"$built.json"
  local warnings
  warnings=$(jq -r 'select(.reason == "compiler-message" and .message.level == "warning")
                    | .message.rendered' "$built.json")
  if [ -n "$warnings" ]; then
    echo "$warnings" >&2
    echo "the product binary (--no-default-features) builds with warnings" >&2
    return 1
  fi
  cargo metadata --no-deps --format-version 1 --locked \
    | jq -r '.workspace_members[]' | sort -u >"$built.members"
  # Each compiled unit of a package not in the workspace, as "package file" (the
  # file name carries the unit's hash: its features, profile and dependencies).
  jq -r 'select(.reason == "compiler-artifact") | .package_id as $p | .filenames[] | "\($p) \(.)"' \
    "$built.json" | sort -u | join -v1 - "$built.members" >"$built"
  cp "$target/debug/podgate" "$target/debug/podgate-product"
}

# The test build (`cargo test … --no-run`, its arguments given), failing if a unit
# of a third-party package the product build compiled ($1) is not one it uses.
podgate_build_tests_checking_drift() {
  local built=$1
  local -x LC_ALL=C
  shift
  cargo test "$@" --message-format=json-render-diagnostics >"$built.tests.json"
  # A unit of the product build that the test build did not use (fresh or compiled)
  # was compiled for the product binary alone.
  local drift
  drift=$(jq -r 'select(.reason == "compiler-artifact") | .package_id as $p | .filenames[] | "\($p) \(.)"' \
    "$built.tests.json" | sort -u | comm -23 "$built" - | cut -d' ' -f1 | sort -u)
  if [ -n "$drift" ]; then
    echo "compiled twice, with other features for the product binary than for the tests:" >&2
    echo "$drift" >&2
    echo "turn the test build's features on in the root Cargo.toml ([dependencies], see its comment)" >&2
    return 1
  fi
}
