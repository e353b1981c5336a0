#!/usr/bin/env python3
"""Arithmetic and report for scripts/bench-proxy.sh.

The shell runs the passes and leaves raw files in one directory, named
`<repeat>.<token>.<target>.<pass>.<ext>`:

- `sat.wrk` + `sat.cpu`: the saturation pass (wrk's output; the proxy process's
  utime/stime ticks from /proc/<pid>/stat before and after, and CLK_TCK);
- `lat.wrk`: the one-connection pass;
- `strace.wrk` + `strace.txt`: the shorter pass under `strace -c -f`.

This turns them into per-repeat samples, takes the median over repeats of every
figure, prints the table with the ratios against HAProxy as the headline, and writes
everything (medians, spread, every sample) as JSON.

    bench_report.py --dir RAW --json OUT.json [--config KEY=VALUE ...]
"""

import argparse
import json
import os
import re
import statistics
import sys
from collections import defaultdict

# Syscalls that move request or response bytes; the rest (epoll_wait, accept4,
# getpeername, ...) is bookkeeping.
IO_SYSCALLS = {
    "read", "readv", "recvfrom", "recvmsg", "recvmmsg",
    "write", "writev", "sendto", "sendmsg", "sendmmsg", "sendfile", "splice",
}

# A strace -c figure below this many calls per request is left out of the text
# table (still in the JSON): one-off work amortised over a run.
MIN_PER_REQUEST = 0.01

UNITS_US = {"us": 1.0, "ms": 1e3, "s": 1e6}


def to_us(text):
    """wrk's `312.00us` / `1.20ms` / `2.00s` in microseconds."""
    m = re.fullmatch(r"([0-9.]+)(us|ms|s)", text)
    if not m:
        raise ValueError(f"unexpected latency {text!r}")
    return float(m.group(1)) * UNITS_US[m.group(2)]


def parse_wrk(path):
    """Requests served, req/s, p50/p99 (µs) and non-2xx count from wrk --latency output."""
    text = open(path).read()
    out = {"non_2xx": 0, "socket_errors": 0}
    m = re.search(r"^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m)", text, re.M)
    if not m:
        raise ValueError(f"{path}: no request count in wrk output:\n{text}")
    out["requests"] = int(m.group(1))
    m = re.search(r"^Requests/sec:\s+([0-9.]+)", text, re.M)
    out["rps"] = float(m.group(1))
    for pct, key in (("50%", "p50_us"), ("99%", "p99_us")):
        m = re.search(rf"^\s+{pct}\s+(\S+)", text, re.M)
        out[key] = to_us(m.group(1)) if m else None
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    if m:
        out["non_2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if m:
        out["socket_errors"] = sum(int(g) for g in m.groups())
    return out


def parse_cpu(path):
    """(user seconds, system seconds) spent between the two /proc samples."""
    u0, s0, u1, s1, hz = (int(x) for x in open(path).read().split())
    return (u1 - u0) / hz, (s1 - s0) / hz


def parse_strace(path):
    """{syscall: calls} from a `strace -c` summary."""
    calls = {}
    for line in open(path):
        fields = line.split()
        if len(fields) < 5 or not re.fullmatch(r"[0-9.]+", fields[0]):
            continue
        name = fields[-1]
        if name == "total":
            continue
        calls[name] = calls.get(name, 0) + int(fields[3])
    return calls


def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def spread(values):
    """(max - min) / median, the noise between repeats."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None
    mid = statistics.median(values)
    return (max(values) - min(values)) / mid if mid else None


def collect(raw_dir):
    """samples[token][target] = list of per-repeat dicts."""
    files = defaultdict(dict)
    for name in os.listdir(raw_dir):
        parts = name.split(".")
        if len(parts) != 5:
            continue
        rep, token, target, pass_, ext = parts
        files[(int(rep), token, target)][f"{pass_}.{ext}"] = os.path.join(raw_dir, name)

    samples = defaultdict(lambda: defaultdict(list))
    for (rep, token, target), f in sorted(files.items()):
        s = {"repeat": rep}
        if "sat.wrk" in f:
            sat = parse_wrk(f["sat.wrk"])
            s.update(rps=sat["rps"], sat_requests=sat["requests"], sat_p50_us=sat["p50_us"],
                     sat_p99_us=sat["p99_us"], non_2xx=sat["non_2xx"],
                     socket_errors=sat["socket_errors"])
            if "sat.cpu" in f and sat["requests"]:
                user, system = parse_cpu(f["sat.cpu"])
                s["cpu_user_us"] = user * 1e6 / sat["requests"]
                s["cpu_sys_us"] = system * 1e6 / sat["requests"]
                s["cpu_us"] = s["cpu_user_us"] + s["cpu_sys_us"]
        if "lat.wrk" in f:
            lat = parse_wrk(f["lat.wrk"])
            s.update(lat_rps=lat["rps"], lat_p50_us=lat["p50_us"], lat_p99_us=lat["p99_us"])
            s["non_2xx"] = s.get("non_2xx", 0) + lat["non_2xx"]
        if "strace.txt" in f and "strace.wrk" in f:
            requests = parse_wrk(f["strace.wrk"])["requests"]
            if requests:
                calls = parse_strace(f["strace.txt"])
                per = {k: v / requests for k, v in calls.items()}
                s["syscalls_per_request"] = per
                s["syscalls_total"] = sum(per.values())
                s["syscalls_io"] = sum(v for k, v in per.items() if k in IO_SYSCALLS)
        samples[token][target].append(s)

    # added p50 at one connection: against direct, within the same repeat
    for token, targets in samples.items():
        direct = {s["repeat"]: s.get("lat_p50_us") for s in targets.get("direct", [])}
        for target, runs in targets.items():
            for s in runs:
                d = direct.get(s["repeat"])
                if d is not None and s.get("lat_p50_us") is not None:
                    s["added_p50_us"] = s["lat_p50_us"] - d
    return samples


FIGURES = ["rps", "cpu_us", "cpu_user_us", "cpu_sys_us", "syscalls_total", "syscalls_io",
           "added_p50_us", "lat_p50_us", "lat_p99_us", "sat_p50_us", "sat_p99_us"]


def summarize(samples):
    summary = {}
    for token, targets in samples.items():
        summary[token] = {}
        for target, runs in targets.items():
            fig = {}
            for key in FIGURES:
                values = [r.get(key) for r in runs]
                fig[key] = median(values)
                fig[key + "_spread"] = spread(values)
            names = set()
            for r in runs:
                names |= set(r.get("syscalls_per_request", {}))
            fig["syscalls_per_request"] = {
                n: median([r.get("syscalls_per_request", {}).get(n, 0.0) for r in runs
                           if "syscalls_per_request" in r])
                for n in sorted(names)
            }
            fig["repeats"] = len(runs)
            fig["non_2xx"] = sum(r.get("non_2xx", 0) for r in runs)
            fig["socket_errors"] = sum(r.get("socket_errors", 0) for r in runs)
            summary[token][target] = fig
    return summary


def ratios(summary, against):
    """figure(target) / figure(against) per token, for the headline."""
    out = {}
    for token, targets in summary.items():
        base = targets.get(against)
        if not base:
            continue
        out[token] = {}
        for target, fig in targets.items():
            if target in ("direct", against):
                continue
            r = {}
            for key in ("rps", "cpu_us", "cpu_user_us", "cpu_sys_us", "syscalls_total",
                        "syscalls_io", "added_p50_us"):
                a, b = fig.get(key), base.get(key)
                r[key] = a / b if a is not None and b else None
            out[token][target] = r
    return out


def fmt(v, digits=0, width=8):
    if v is None:
        return "-".rjust(width)
    return f"{v:{width}.{digits}f}"


def pct(v):
    return "" if v is None else f"±{v * 50:.0f}%"


def print_ratios(title, rat, order, only=None):
    print(title)
    print(f"  {'token':<6} {'target':<9} {'req/s':>7} {'cpu/req':>8} {'user':>6} {'sys':>6}"
          f" {'syscalls':>9} {'+p50@1c':>8}")
    for token, targets in rat.items():
        for target in [t for t in order if t in targets and (only is None or t == only)]:
            r = targets[target]
            print(f"  {token:<6} {target:<9} {fmt(r['rps'], 2, 6)}x {fmt(r['cpu_us'], 2, 7)}x"
                  f" {fmt(r['cpu_user_us'], 2, 5)}x {fmt(r['cpu_sys_us'], 2, 5)}x"
                  f" {fmt(r['syscalls_total'], 2, 8)}x {fmt(r['added_p50_us'], 2, 7)}x")


def print_report(summary, rat, against, order):
    print("medians over repeats; ±: half the spread (max-min)/median between repeats")
    for token, targets in summary.items():
        print()
        print(f"[{token}]  {'target':<9} {'req/s':>14} {'cpu_us/req':>15} {'user':>6} {'sys':>6}"
              f" {'syscalls/req':>12} {'io':>5} {'+p50_us@1c':>15} {'p50@1c':>7} {'p99@1c':>7}")
        for target in [t for t in order if t in targets]:
            f = targets[target]
            print(f"{'':{len(token) + 3}}{target:<9} {fmt(f['rps'], 0, 7)} {pct(f['rps_spread']):>6}"
                  f" {fmt(f['cpu_us'], 1, 7)} {pct(f['cpu_us_spread']):>6}"
                  f" {fmt(f['cpu_user_us'], 1, 6)} {fmt(f['cpu_sys_us'], 1, 6)}"
                  f" {fmt(f['syscalls_total'], 2, 12)} {fmt(f['syscalls_io'], 2, 5)}"
                  f" {fmt(f['added_p50_us'], 0, 7)} {pct(f['added_p50_us_spread']):>6}"
                  f" {fmt(f['lat_p50_us'], 0, 7)} {fmt(f['lat_p99_us'], 0, 7)}")
            if f["non_2xx"] or f["socket_errors"]:
                print(f"{'':{len(token) + 13}}warning: {f['non_2xx']} non-2xx responses, "
                      f"{f['socket_errors']} socket errors")
        print(f"{'':{len(token) + 3}}syscalls per request (strace -c, >= {MIN_PER_REQUEST}):")
        for target in [t for t in order if t in targets]:
            per = targets[target]["syscalls_per_request"]
            shown = ", ".join(f"{n} {v:.2f}" for n, v in
                              sorted(per.items(), key=lambda kv: -kv[1]) if v >= MIN_PER_REQUEST)
            print(f"{'':{len(token) + 5}}{target:<9} {shown or '-'}")
    print()
    print_ratios(f"headline: ratios against {against} (same run, medians)", rat, order)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="raw files written by bench-proxy.sh")
    ap.add_argument("--json", required=True, help="where to write the JSON report")
    ap.add_argument("--against", default="haproxy", help="the target ratios are taken against")
    ap.add_argument("--order", default="direct,before,pingora,podgate,haproxy,nginx")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                    help="bench settings recorded in the JSON")
    args = ap.parse_args()

    samples = collect(args.dir)
    if not samples:
        sys.exit(f"no samples in {args.dir}")
    summary = summarize(samples)
    rat = ratios(summary, args.against)
    order = args.order.split(",")
    print_report(summary, rat, args.against, order)
    before = ratios(summary, "before")
    if before:
        print()
        print_ratios("podgate against the baseline build (same run, medians)", before, order,
                     only="podgate")
    pingora = ratios(summary, "pingora")
    if pingora:
        print()
        print_ratios("podgate (fast path) against podgate with fast_path = false (same run, medians)",
                     pingora, order, only="podgate")

    report = {
        "config": dict(kv.split("=", 1) for kv in args.config),
        "against": args.against,
        "medians": summary,
        "ratios": rat,
        "ratios_against_before": ratios(summary, "before"),
        "ratios_against_pingora": ratios(summary, "pingora"),
        "samples": samples,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(report, out, indent=2, sort_keys=True)
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
