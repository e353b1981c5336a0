"""Protobuf descriptor sets as comparable lines, for the scripts that check podgate's
transcriptions of GitLab's protobufs against GitLab's own files
(`scripts/check-gitlab-protos.sh`, `scripts/check-job-router-proto.sh`).

Input is `protoc --decode=google.protobuf.FileDescriptorSet` text. Each line names one
fact of the wire: per message (nested ones too) each field's number, name, label,
type, type name, JSON name, oneof and proto3 `optional`; reserved ranges and names;
per enum its values; per service each method's input, output and streaming.
"""
import re

TOKEN = re.compile(r'\s*(?:(\w+)\s*\{|(\})|(\w+):\s*("(?:[^"\\]|\\.)*"|\S+))')


def parse(text):
    """Protobuf text format as nested lists of (key, value) pairs."""
    stack = [[]]
    for m in TOKEN.finditer(text):
        if m.group(1):
            node = []
            stack[-1].append((m.group(1), node))
            stack.append(node)
        elif m.group(2):
            stack.pop()
        else:
            stack[-1].append((m.group(3), m.group(4).strip('"')))
    return stack[0]


def get(node, key, default=""):
    return next((v for k, v in node if k == key), default)


def all_of(node, key):
    return [v for k, v in node if k == key]


def message_lines(prefix, msg, out):
    name = f"{prefix}.{get(msg, 'name')}"
    oneofs = [get(o, "name") for o in all_of(msg, "oneof_decl")]
    for f in all_of(msg, "field"):
        idx = get(f, "oneof_index")
        synthetic = get(f, "proto3_optional") == "true"
        oneof = "" if idx == "" or synthetic else oneofs[int(idx)]
        out.append(
            f"message {name} field {get(f, 'number'):>3} {get(f, 'name')} "
            f"{get(f, 'label')} {get(f, 'type')} {get(f, 'type_name')} "
            f"json={get(f, 'json_name')} oneof={oneof} optional={synthetic}"
        )
    for r in all_of(msg, "reserved_range"):
        out.append(f"message {name} reserved {get(r, 'start')}..{get(r, 'end')}")
    for r in all_of(msg, "reserved_name"):
        out.append(f"message {name} reserved name {r}")
    for e in all_of(msg, "enum_type"):
        enum_lines(name, e, out)
    for nested in all_of(msg, "nested_type"):
        message_lines(name, nested, out)


def enum_lines(prefix, enum, out):
    name = f"{prefix}.{get(enum, 'name')}"
    for v in all_of(enum, "value"):
        out.append(f"enum {name} value {get(v, 'number')} {get(v, 'name')}")


def flatten(path, keep, file_lines=True):
    """The sorted lines of the files `keep` accepts (a file descriptor node)."""
    with open(path) as fh:
        tree = parse(fh.read())
    out = []
    for fd in all_of(tree, "file"):
        if not keep(fd):
            continue
        pkg = get(fd, "package")
        if file_lines:
            out.append(f"file {get(fd, 'name')} package {pkg} syntax={get(fd, 'syntax')}")
        for msg in all_of(fd, "message_type"):
            message_lines(pkg, msg, out)
        for e in all_of(fd, "enum_type"):
            enum_lines(pkg, e, out)
        for svc in all_of(fd, "service"):
            for m in all_of(svc, "method"):
                out.append(
                    f"service {pkg}.{get(svc, 'name')} method {get(m, 'name')} "
                    f"{get(m, 'input_type')} -> {get(m, 'output_type')} "
                    f"client_streaming={get(m, 'client_streaming', 'false')} "
                    f"server_streaming={get(m, 'server_streaming', 'false')}"
                )
    return sorted(out)
