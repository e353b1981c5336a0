#!/usr/bin/env bash
# Compare podgate's transcription of GitLab's Topology Service schema
# (pod-registry/topology-service/proto/) with GitLab's own, by descriptor: per file its
# package, syntax, imports and options (go_package, ruby_package, ...); per message
# (nested ones too) each field's name, number, label, type, type name, oneof, JSON
# name and proto3 `optional`, reserved ranges and names; per enum its values; the
# `access_control` extension; per service each method's input, output, streaming and
# options, byte for byte and decoded (the `access_control` rules, field 90000, and
# the `google.api.http` rule, field 72295728). Prints the differences; exits 1 if any.
#
#   scripts/check-topology-protos.sh <dir>
#
# <dir> is GitLab's vendored client gem (gitlabhq's
# `vendor/gems/gitlab-topology-service-client/`) or a gitlabhq checkout holding it.
# The gem carries no .proto files: each `lib/**/*_pb.rb` holds its file's serialized
# FileDescriptorProto as a Ruby string literal (`descriptor_data = "..."`), which is
# read back into bytes (scripts/lib/topology_descriptors.py) and compared with what
# protoc makes of the transcription (`protoc --include_imports --descriptor_set_out`).
# Every file GitLab's descriptors name must be transcribed at the same relative path;
# a transcribed file GitLab has not (other than googleapis' and protobuf's) is a
# difference too. `*_services_pb.rb` (gRPC stubs) carry no descriptor and are skipped;
# a `*_pb.rb` in the older DSL format, without `descriptor_data`, is a difference
# (it cannot be compared). TOPOLOGY_PROTO names another directory of transcribed
# protobufs. Needs protoc (Debian `protobuf-compiler`, which ships the well-known
# types) and python3; no python protobuf module.
set -euo pipefail

src=${1:?usage: $0 <gitlab-topology-service-client gem dir, or a gitlabhq checkout>}
here=$(cd "$(dirname "$0")/.." && pwd)
ours=${TOPOLOGY_PROTO:-$here/pod-registry/topology-service/proto}

gem=$src
if [ -d "$src/vendor/gems/gitlab-topology-service-client" ]; then
  gem=$src/vendor/gems/gitlab-topology-service-client
fi
if [ ! -d "$gem/lib" ]; then
  echo "no lib/ under $gem: not the gitlab-topology-service-client gem" >&2
  exit 2
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if [ -f "$gem/REVISION" ]; then
  echo "GitLab's gem: $gem (topology-service REVISION $(head -c 40 "$gem/REVISION"))"
else
  echo "GitLab's gem: $gem"
fi

# GitLab's descriptors, as one FileDescriptorSet.
PYTHONPATH="$here/scripts/lib" python3 - "$gem" "$tmp/gitlab.pb" <<'PY'
import pathlib
import sys

from topology_descriptors import descriptor_from_pb_rb, file_name

gem, out = pathlib.Path(sys.argv[1]), sys.argv[2]
blob, bad = bytearray(), 0
for path in sorted((gem / "lib").rglob("*_pb.rb")):
    rel = path.relative_to(gem)
    if path.name.endswith("_services_pb.rb"):
        continue
    data = descriptor_from_pb_rb(path.read_text(encoding="utf-8"))
    if data is None:
        print(f"! {rel}: no descriptor_data (older DSL format), cannot compare")
        bad += 1
        continue
    print(f"  {rel}: {file_name(data)} ({len(data)} bytes)")
    # FileDescriptorSet.file = 1, length-delimited
    n, size = len(data), bytearray()
    while True:
        size.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            break
    blob += b"\x0a" + size + data
if not blob:
    sys.exit("no descriptors found under lib/")
open(out, "wb").write(bytes(blob))
open(out + ".unreadable", "w").write(str(bad))
PY

# protoc's own parser must accept GitLab's bytes as descriptors, too.
protoc -I/usr/include --decode=google.protobuf.FileDescriptorSet \
  google/protobuf/descriptor.proto <"$tmp/gitlab.pb" >"$tmp/gitlab.txt"

(cd "$ours" && protoc -I. -I/usr/include --include_imports --descriptor_set_out="$tmp/ours.pb" \
  $(find . -name '*.proto' | sed 's|^\./||' | sort))

PYTHONPATH="$here/scripts/lib" python3 - "$tmp/gitlab.pb" "$tmp/ours.pb" "$ours" <<'PY'
"""Flatten both descriptor sets into lines and diff them, file by file."""
import difflib
import pathlib
import sys

from topology_descriptors import (descriptor_set_files, file_lines, file_name,
                                  method_option_summary, rule_names_of)

gitlab_pb, ours_pb, ours_dir = sys.argv[1:4]
gitlab = {file_name(b): b for b in descriptor_set_files(open(gitlab_pb, "rb").read())}
ours = {file_name(b): b for b in descriptor_set_files(open(ours_pb, "rb").read())}
failures = int(open(gitlab_pb + ".unreadable").read())
rule_names = rule_names_of(gitlab.values())

total_g = total_o = 0
for name in sorted(gitlab):
    g = sorted(file_lines(gitlab[name], rule_names))
    total_g += len(g)
    if name not in ours:
        print(f"--- {name}: not transcribed")
        failures += len(g)
        continue
    o = sorted(file_lines(ours[name], rule_names))
    total_o += len(o)
    diff = [d for d in difflib.unified_diff(g, o, f"gitlab {name}", f"transcription {name}", lineterm="", n=0)]
    if diff:
        print("\n".join(diff))
        failures += sum(1 for d in diff if d[:1] in "+-" and d[:3] not in ("+++", "---"))

# Transcribed files GitLab's gem does not describe (imports from googleapis and
# protobuf's well-known types, and gRPC's health service, aside).
root = pathlib.Path(ours_dir)
for path in sorted(root.rglob("*.proto")):
    rel = str(path.relative_to(root))
    if rel not in gitlab and not rel.startswith(("google/", "grpc/")):
        print(f"+++ {rel}: transcribed, but not in GitLab's gem")
        failures += 1

print(f"{total_g} descriptor lines from GitLab's {len(gitlab)} files, {total_o} from the transcription")
print("GitLab's method options (access_control rules, google.api.http):")
for path, hexbytes, decoded in method_option_summary(gitlab.values(), rule_names):
    print(f"  {path}: {decoded} [{hexbytes}]")
print(f"{failures} differences")
sys.exit(1 if failures else 0)
PY
