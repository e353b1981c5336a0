#!/usr/bin/env bash
# Compare the selection of GitLab's route snapshot the path-rule table test replays
# (tests/topology_service/gitlab_routes.tsv) with the snapshot itself: every line
# must be one of its routes, field for field (template, example, acceptsFormat,
# dottedExample), and every top-level word of it (the first path segment of a
# template that starts with a literal: what GitLab's HTTP Router guards) must have
# a line. Prints the differences; exits 1 if any.
#
#   scripts/check-routes-snapshot.sh <gitlab_routes.json>
#
# The file is gitlabhq's `config/routing/gitlab_routes.json` (or the HTTP Router's
# `test/routes/gitlab_routes.json`), from a checkout or raw download. Needs python3.
set -euo pipefail

snapshot=${1:?usage: $0 <gitlab_routes.json>}
here=$(cd "$(dirname "$0")/.." && pwd)
python3 - "$snapshot" "$here/tests/topology_service/gitlab_routes.tsv" <<'PY'
import json, sys

snapshot = json.load(open(sys.argv[1]))
by_template = {e["template"]: e for e in snapshot}


def word(template):
    """A template's top-level word, or None when its first segment is a parameter."""
    if template.startswith("("):
        return None
    first = template[1:].split("/")[0].split("(")[0]
    return None if any(c in first for c in ":*") else first


ours, problems = set(), []
for n, line in enumerate(open(sys.argv[2]), 1):
    if line.startswith("#") or not line.strip():
        continue
    template, example, accepts, dotted = line.rstrip("\n").split("\t")
    ours.add(template)
    want = {"template": template, "example": example}
    if accepts == "1":
        want["acceptsFormat"] = True
    if dotted != "-":
        want["dottedExample"] = dotted
    theirs = by_template.get(template)
    if theirs is None:
        problems.append(f"line {n}: {template}: not in the snapshot")
    elif theirs != want:
        problems.append(f"line {n}: {template}: ours {want}, the snapshot's {theirs}")
words = {word(e["template"]) for e in snapshot} - {None}
covered = {word(t) for t in ours} - {None}
for w in sorted(words - covered):
    problems.append(f"top-level word {w!r} has no line (e.g. {next(e['template'] for e in snapshot if word(e['template']) == w)})")
print(f"{len(snapshot)} routes in the snapshot, {len(ours)} lines, {len(words)} top-level words")
for p in problems:
    print(p)
sys.exit(1 if problems else 0)
PY
