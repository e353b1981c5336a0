#!/usr/bin/env bash
# Compare the tests' transcription of GitLab's agent protobufs
# (agent/e2e/tests/gitlab_wire/proto/) with GitLab's own files, by descriptor set:
# per message (nested ones too) each field's name, number, label, type, type name,
# oneof, json name and proto3 `optional`; per enum its values; per service each
# method's name, input, output and streaming. Prints the differences; exits 1 if any.
#
#   scripts/check-gitlab-protos.sh <gitlab-agent checkout, or a git mirror of it> [--product]
#
# With --product it also compares podgate's own protobufs (agent/proto/) with GitLab's,
# message by message: every field, enum value and method of GitLab's must be there
# alike (a difference fails the run); what podgate adds (methods such as
# `KubernetesApi/WatchGraph`, fields, messages) is listed as an addition.
# PODGATE_PROTO names another directory of podgate protobufs to compare.
#
# A mirror (bare repository) is read at GITLAB_AGENT_COMMIT (default: GitLab 16.5's
# agent, e02ad05f88598c93c414c52dd4a89e58a75adb4a, of github.com/pluralsh/kubernetes-agent).
# GitLab's files import `validate/validate.proto` (protoc-gen-validate) and the
# `automata` options; both are runtime checks, not wire, so their imports and options
# are stripped into a temporary copy before protoc reads it. `google/rpc/status.proto`
# (googleapis) comes from the transcription. Nothing of GitLab's is built or kept.
# Needs protoc (Debian `protobuf-compiler`, which ships the well-known types) and
# python3.
set -euo pipefail

src=${1:?usage: $0 <gitlab-agent checkout or git mirror> [--product]}
product=${2:-}
commit=${GITLAB_AGENT_COMMIT:-e02ad05f88598c93c414c52dd4a89e58a75adb4a}
here=$(cd "$(dirname "$0")/.." && pwd)
ours=$here/agent/e2e/tests/gitlab_wire/proto

files=(
  pkg/entity/entity.proto
  pkg/event/event.proto
  pkg/agentcfg/agentcfg.proto
  internal/tool/prototool/prototool.proto
  internal/tool/grpctool/grpctool.proto
  internal/module/agent_configuration/rpc/rpc.proto
  internal/module/agent_registrar/rpc/rpc.proto
  internal/module/reverse_tunnel/info/info.proto
  internal/module/reverse_tunnel/rpc/rpc.proto
  internal/module/kubernetes_api/rpc/rpc.proto
  internal/module/gitlab_access/rpc/rpc.proto
  internal/module/agent_tracker/agent_tracker.proto
  internal/module/agent_tracker/rpc/rpc.proto
  internal/module/notifications/rpc/rpc.proto
)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/gitlab" "$tmp/out"

bare=false
if git -C "$src" rev-parse --is-bare-repository 2>/dev/null | grep -qx true; then
  bare=true
fi
for f in "${files[@]}"; do
  mkdir -p "$tmp/gitlab/$(dirname "$f")"
  if $bare; then
    git -C "$src" show "$commit:$f" >"$tmp/gitlab/$f"
  else
    cp "$src/$f" "$tmp/gitlab/$f"
  fi
done
mkdir -p "$tmp/gitlab/google/rpc"
cp "$ours/google/rpc/status.proto" "$tmp/gitlab/google/rpc/status.proto"

python3 - "$tmp/gitlab" "${files[@]}" <<'PY'
"""Strip the validate and automata imports and options from GitLab's files."""
import re
import sys

root, files = sys.argv[1], sys.argv[2:]
DROP = ("(validate.", "(grpctool.automata.")


def split_top(s):
    """Split on commas outside brackets and braces."""
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def strip(text):
    text = re.sub(r'^\s*import\s+"(validate/validate|internal/tool/grpctool/automata/automata)\.proto";\s*$',
                  "", text, flags=re.M)
    text = re.sub(r"^\s*option\s+\((validate|grpctool\.automata)\.[^;]*;\s*(//.*)?$", "", text, flags=re.M)
    out, i = "", 0
    while i < len(text):
        ch = text[i]
        if ch == "/" and text[i:i + 2] == "//":
            j = text.find("\n", i)
            j = len(text) if j < 0 else j
            out += text[i:j]
            i = j
            continue
        if ch == "[":
            depth, j = 0, i
            while True:
                if text[j] in "[{":
                    depth += 1
                elif text[j] in "]}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            inner = text[i + 1:j]
            kept = [p.strip() for p in split_top(inner) if not p.strip().startswith(DROP)]
            if kept:
                out += "[" + ", ".join(kept) + "]"
            i = j + 1
            continue
        out += ch
        i += 1
    return out


for f in files:
    path = f"{root}/{f}"
    with open(path) as fh:
        text = fh.read()
    with open(path, "w") as fh:
        fh.write(strip(text))
PY

(cd "$tmp/gitlab" && protoc -I. -I/usr/include --include_imports --descriptor_set_out="$tmp/out/gitlab.pb" "${files[@]}")
(cd "$ours" && protoc -I. -I/usr/include --include_imports --descriptor_set_out="$tmp/out/ours.pb" "${files[@]}")

sides=(gitlab ours)
if [ "$product" = --product ]; then
  (cd "${PODGATE_PROTO:-$here/agent/proto}" && protoc -I. -I/usr/include --include_imports \
    --descriptor_set_out="$tmp/out/product.pb" $(find . -name '*.proto' ! -name kas.proto | sed 's|^\./||' | sort))
  sides+=(product)
fi
wkt=/usr/include/google/protobuf/descriptor.proto
for side in "${sides[@]}"; do
  protoc -I/usr/include --decode=google.protobuf.FileDescriptorSet "$wkt" \
    <"$tmp/out/$side.pb" >"$tmp/out/$side.txt"
done

FILES="${files[*]}" PYTHONPATH="$here/scripts/lib" python3 - "$tmp/out/gitlab.txt" "$tmp/out/ours.txt" "$product" "$tmp/out/product.txt" <<'PY'
"""Flatten two decoded FileDescriptorSets into comparable lines and diff them."""
import difflib
import re
import sys

import os

gitlab_txt, ours_txt, mode, product_txt = sys.argv[1:5]
files = set(os.environ["FILES"].split())
from proto_lines import all_of, flatten, get  # noqa: E402  (scripts/lib)


listed = lambda fd: get(fd, "name") in files
gitlab, ours = flatten(gitlab_txt, listed), flatten(ours_txt, listed)
diff = list(difflib.unified_diff(gitlab, ours, "gitlab", "transcription", lineterm="", n=0))
print(f"{len(gitlab)} descriptor lines from GitLab's files, {len(ours)} from the transcription")
failed = False
if diff:
    print("\n".join(diff))
    print(f"{sum(1 for d in diff if d[:1] in '+-' and d[:3] not in ('+++', '---'))} differences")
    failed = True
else:
    print("0 differences")

if mode == "--product":
    # By package and message, not by file: podgate's files are laid out differently.
    # JSON names do not travel in binary protobuf; they are compared apart.
    reference_json = set(flatten(gitlab_txt, listed, file_lines=False))
    packages = {line.split()[1].rsplit(".", 1)[0] for line in reference_json}
    in_package = lambda fd: get(fd, "package") in packages or get(fd, "package").startswith("gitlab.agent.")
    podgate_json = set(flatten(product_txt, keep=in_package, file_lines=False))
    wire = lambda lines: {re.sub(r" json=\S+", "", line) for line in lines}
    reference, podgate = wire(reference_json), wire(podgate_json)
    ident = lambda line: tuple(line.split()[:4])
    known = {ident(line) for line in reference}
    missing = sorted(reference - podgate)
    changed_or_added = sorted(podgate - reference)
    added = [line for line in changed_or_added if ident(line) not in known]
    print(f"\npodgate's agent/proto against GitLab's: {len(missing)} of GitLab's lines missing or different on the wire")
    for line in missing:
        print(f"- {line}")
        for p in changed_or_added:
            if ident(p) == ident(line):
                print(f"+ {p}")
    json_only = sorted((reference_json - podgate_json) - {l for l in reference_json if re.sub(r" json=\S+", "", l) in missing})
    print(f"{len(json_only)} fields with another JSON name than GitLab's (not on the binary wire):")
    for line in json_only:
        print(f"  {line}")
    print(f"{len(added)} podgate additions:")
    for line in added:
        print(f"  {line}")
    failed = failed or bool(missing)

sys.exit(1 if failed else 0)
PY
