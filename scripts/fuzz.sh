#!/usr/bin/env bash
# Run every cargo-fuzz target (fuzz/README.md) on its committed corpus and print a
# table: executions, exec/s and crashes per target. Exits non-zero if any crashed.
#
#   scripts/fuzz.sh [SECONDS]            each target for SECONDS (default 60)
#   scripts/fuzz.sh --runs N             each target for N executions
#   scripts/fuzz.sh 10 proxy_path ...    only the targets named
#
# The committed corpus (fuzz/corpus/<target>) is only read: what libFuzzer finds is
# written to a temporary directory, removed afterwards (set FUZZ_CORPUS_OUT=<dir> to
# keep it in <dir>/<target>, e.g. to minimise it into the corpus with
# `cargo +nightly fuzz cmin`), so a run never dirties the checkout. A crashing
# input is saved as fuzz/artifacts/<target>/crash-… (ignored by git); reproduce it
# with `cargo +nightly fuzz run -s none <target> fuzz/artifacts/<target>/crash-…`.
# FUZZ_ARGS: more libFuzzer flags for every target (e.g. `-max_len=65536`);
# FUZZ_SANITIZER: cargo-fuzz's `--sanitizer` (default none).
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=60)
mode="60 s"
case "${1:-}" in
--runs)
    [[ "${2:-}" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS | --runs N] [TARGET...]" >&2; exit 2; }
    limit=(-runs="$2")
    mode="$2 runs"
    shift 2
    ;;
'' | -*) ;;
*)
    [[ "$1" =~ ^[0-9]+$ ]] || { echo "usage: $0 [SECONDS | --runs N] [TARGET...]" >&2; exit 2; }
    limit=(-max_total_time="$1")
    mode="$1 s"
    shift
    ;;
esac

if ! cargo +nightly --version >/dev/null 2>&1; then
    echo "==> installing the nightly toolchain (sanitizers, coverage instrumentation)"
    rustup toolchain install nightly --profile minimal
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# Release with debug assertions (cargo-fuzz's default), every target at once so the
# dependencies are compiled once, 16 codegen units (cargo-fuzz's 1 doubles the cold
# build), and no sanitizer: podgate's crates forbid `unsafe`, and AddressSanitizer
# would halve the executions; FUZZ_SANITIZER=address for a run that wants it.
build=(--codegen-units 16 --sanitizer "${FUZZ_SANITIZER:-none}")
echo "==> cargo fuzz build ${build[*]}"
started=$SECONDS
cargo +nightly fuzz build "${build[@]}"
echo "built in $((SECONDS - started)) s"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_odr_violation=0}" # as cargo fuzz run sets it
bin="fuzz/target/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"

if [[ $# -gt 0 ]]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list)
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
    "$bin/$t" "$out" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
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
