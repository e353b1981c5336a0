#!/usr/bin/env bash
# Run every fuzz target (fuzz/README.md) on its committed corpus and print a table:
# executions, exec/s and crashes per target. Exits non-zero if any crashed.
#
#   scripts/fuzz.sh [SECONDS]            each target for SECONDS (default 60)
#   scripts/fuzz.sh --runs N             each target for N executions
#   scripts/fuzz.sh 10 proxy_path ...    only the targets named
#   scripts/fuzz.sh --quick 5            CI's stage (scripts/test.sh): see below
#
# Builds with the stable toolchain and libFuzzer (libfuzzer-sys), no cargo-fuzz:
# - default: the `fuzz` profile (../Cargo.toml: release with debug assertions) and
#   every crate instrumented for coverage, as `cargo fuzz build -s none` does;
# - --quick: the test build's dependencies reused as they are, only podgate's own
#   crates instrumented (scripts/lib/sancov-rustc), unoptimised: a minute's build
#   after `cargo test` instead of a cold one, for a brief run of every target.
# No sanitizer: podgate's crates deny `unsafe` (one exception, proxy/src/handover.rs,
# reached by no target), and AddressSanitizer halves the
# executions; FUZZ_SANITIZER=address adds it (nightly toolchain, `-Zsanitizer`).
#
# The committed corpus (fuzz/corpus/<target>) is only read: what libFuzzer finds is
# written to a temporary directory, removed afterwards (set FUZZ_CORPUS_OUT=<dir> to
# keep it in <dir>/<target>, e.g. to merge into the corpus, fuzz/README.md), so a run
# never dirties the checkout. A crashing input is saved as
# fuzz/artifacts/<target>/crash-… (ignored by git); reproduce it by running the
# binary on that file (`PODGATE_FUZZ_TARGET=<target> target/<host>/fuzz/fuzz FILE`),
# and keep it under fuzz/regressions/<target>/ once fixed (`cargo test -p
# podgate-fuzz` replays both directories).
# FUZZ_ARGS: more libFuzzer flags for every target (e.g. `-max_len=65536`).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
if [[ "${1:-}" == --quick ]]; then
    quick=1
    shift
fi
usage() { echo "usage: $0 [--quick] [SECONDS | --runs N] [TARGET...]" >&2; exit 2; }
limit=(-max_total_time=60)
mode="60 s"
case "${1:-}" in
--runs)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || usage
    limit=(-runs="$2")
    mode="$2 runs"
    shift 2
    ;;
'') ;;
-*) usage ;;
*)
    [[ "$1" =~ ^[0-9]+$ ]] || usage
    limit=(-max_total_time="$1")
    mode="$1 s"
    shift
    ;;
esac

started=$SECONDS
if [[ $quick == 1 ]]; then
    # Selecting the corpus test across the workspace resolves features as
    # `cargo test --workspace` does, so every dependency is already built; its
    # binary (`fuzz`, every target) is built with it.
    echo "==> building the targets instrumented (podgate's crates only, debug)"
    RUSTC_WORKSPACE_WRAPPER="$PWD/scripts/lib/sancov-rustc" \
        cargo test --workspace --locked --test corpus --no-run --quiet
    fuzz="target/debug/fuzz"
else
    # `cargo fuzz build`'s flags (all stable -C options), with --target so that
    # build scripts and proc macros are not instrumented.
    host="$(rustc -vV | sed -n 's/^host: //p')"
    flags="$(scripts/lib/sancov-rustc --flags)"
    toolchain=()
    if [[ -n "${FUZZ_SANITIZER:-}" ]]; then
        flags+=" -Zsanitizer=$FUZZ_SANITIZER"
        toolchain=(+nightly)
        export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}" # as cargo fuzz sets it
    fi
    echo "==> building the targets instrumented (profile fuzz, $host)"
    RUSTFLAGS="$flags" cargo "${toolchain[@]}" build --locked --profile fuzz \
        --target "$host" -p podgate-fuzz --bin fuzz --quiet
    fuzz="target/$host/fuzz/fuzz"
fi
echo "built in $((SECONDS - started)) s"

# The targets run on libFuzzer's main thread, whose stack is RLIMIT_STACK. The long
# runs get kas's and agentk's: a tokio worker's 2 MiB, so a recursion that would
# abort them crashes here. Unoptimised frames are 10-100 times larger (the `cel`
# crate's evaluator, `#[inline(always)]` and so built unoptimised inside
# podgate-agent, takes ~57 KB a level against <2 KB in release: a 230-term chain
# within cel-go's limit of 250 overflowed 8 MiB in CI), so --quick gets 64 MiB.
if [[ $quick == 1 ]]; then
    ulimit -s 65536
else
    ulimit -s 2048
fi

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cd fuzz/fuzz_targets && ls -- *.rs | sed 's/\.rs$//' | grep -vx mod)
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=0
rows=()
for t in "${targets[@]}"; do
    out="${FUZZ_CORPUS_OUT:+$FUZZ_CORPUS_OUT/$t}"
    out="${out:-$work/corpus/$t}"
    mkdir -p "$out" "fuzz/corpus/$t"
    log="$work/$t.log"
    dict=()
    case "$t" in
    proxy_request_head | proxy_response_head | proxy_route) dict=(-dict=fuzz/dict/http.dict) ;;
    graph_request | graph_ws) dict=(-dict=fuzz/dict/graph.dict) ;;
    esac
    echo "==> $t ($mode)"
    status=0
    mkdir -p "fuzz/artifacts/$t"
    # What `cargo fuzz run` runs, without a cargo invocation per target.
    # shellcheck disable=SC2086 # FUZZ_ARGS is a list of flags
    seeds=("fuzz/corpus/$t")
    [[ -d "fuzz/regressions/$t" ]] && seeds+=("fuzz/regressions/$t")
    PODGATE_FUZZ_TARGET="$t" "$fuzz" "$out" "${seeds[@]}" -artifact_prefix="fuzz/artifacts/$t/" \
        "${limit[@]}" "${dict[@]}" -print_final_stats=1 -timeout=30 ${FUZZ_ARGS:-} >"$log" 2>&1 ||
        status=$?
    execs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)"
    rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n1)"
    crashes=0
    if [[ $status -ne 0 ]]; then
        crashes=1
        failed=1
        grep -E -A4 '^(==[0-9]+==ERROR|thread .* panicked|SUMMARY|.*Test unit written to)' "$log" | head -n 30 >&2 || true
        [[ -n "$execs" ]] || tail -n 30 "$log" >&2
    fi
    rows+=("$(printf '%-22s %14s %10s %8s' "$t" "${execs:--}" "${rate:--}" "$crashes")")
done

echo
printf '%-22s %14s %10s %8s\n' target executions exec/s crashes
printf '%s\n' "${rows[@]}"
exit "$failed"
