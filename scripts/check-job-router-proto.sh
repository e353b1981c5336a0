#!/usr/bin/env bash
# Compare podgate's Job Router protobuf (agent/proto/gitlab/job_router.proto, what kas
# serves) with gitlab-runner's own (`router/rpc/rpc.proto`, what runners call), by
# descriptor set (scripts/lib/proto_lines.py: every field's number, name, label, type,
# JSON name; every method's input, output and streaming; the package, which is on the
# wire in the method path). Prints both sides' lines and the differences; exits 1 if
# any.
#
#   scripts/check-job-router-proto.sh <gitlab-runner checkout, or a git mirror of it>
#
# A mirror (bare repository) is read at GITLAB_RUNNER_COMMIT (default d79f3e7b, the
# commit podgate's transcription and the tests' runner-shaped client were written
# from; github.com/gitlabhq/gitlab-runner). Needs protoc and python3.
set -euo pipefail

src=${1:?usage: $0 <gitlab-runner checkout or git mirror>}
commit=${GITLAB_RUNNER_COMMIT:-d79f3e7b}
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/runner/router/rpc"

if git -C "$src" rev-parse --is-bare-repository 2>/dev/null | grep -qx true; then
  git -C "$src" show "$commit:router/rpc/rpc.proto" >"$tmp/runner/router/rpc/rpc.proto"
else
  cp "$src/router/rpc/rpc.proto" "$tmp/runner/router/rpc/rpc.proto"
fi
(cd "$tmp/runner" && protoc -I. --descriptor_set_out="$tmp/runner.pb" router/rpc/rpc.proto)
(cd "$here/agent/proto" && protoc -I. --descriptor_set_out="$tmp/podgate.pb" gitlab/job_router.proto)
for side in runner podgate; do
  protoc -I/usr/include --decode=google.protobuf.FileDescriptorSet \
    /usr/include/google/protobuf/descriptor.proto <"$tmp/$side.pb" >"$tmp/$side.txt"
done

PYTHONPATH="$here/scripts/lib" python3 - "$tmp/runner.txt" "$tmp/podgate.txt" <<'PY'
import difflib
import sys

from proto_lines import flatten

every = lambda fd: True
runner, podgate = (flatten(p, every, file_lines=False) for p in sys.argv[1:3])
print("\n".join(runner))
diff = [d for d in difflib.unified_diff(runner, podgate, "gitlab-runner", "podgate", lineterm="", n=0)]
changed = [d for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---")]
print(f"{len(runner)} descriptor lines from gitlab-runner's router/rpc/rpc.proto, {len(podgate)} from podgate's; {len(changed)} differences")
if diff:
    print("\n".join(diff))
sys.exit(1 if changed else 0)
PY
