"""GitLab Topology Service descriptors as comparable lines, for
`scripts/check-topology-protos.sh`.

GitLab's vendored client gem (gitlabhq `vendor/gems/gitlab-topology-service-client/`)
carries each schema file only as a serialized `FileDescriptorProto`, written into its
`lib/**/*_pb.rb` as a Ruby double-quoted string literal (`descriptor_data = "..."`).
This module reads that literal back into bytes, and decodes `FileDescriptorProto`s
(from those literals, or from a `protoc --descriptor_set_out` set) with a small
protobuf wire decoder, so the check needs python3 and protoc but no protobuf module.

Each line names one fact of the schema: per file its package, syntax, imports and
options (every option field, and the options' raw bytes); per message (nested ones
too) each field's number, name, label, type, type name, JSON name, oneof, proto3
`optional`, default and options; oneofs, reserved ranges and names, extension ranges;
per enum its values; extensions; per service each method's input, output, streaming
and options, the raw bytes and decoded: the Topology Service's `access_control`
(field 90000 of MethodOptions) and `google.api.http` (field 72295728).
"""
import re

# ---------------------------------------------------------------- Ruby literal


class RubyLiteralError(ValueError):
    pass


SIMPLE_ESCAPES = {
    "n": b"\n", "t": b"\t", "r": b"\r", "e": b"\x1b", "s": b" ", "a": b"\x07",
    "b": b"\x08", "f": b"\x0c", "v": b"\x0b",
}


def ruby_dq_unescape(body):
    """The bytes of a Ruby double-quoted string literal's body (between the quotes).

    Handles \\n \\t \\r \\e \\s \\a \\b \\f \\v, \\xN(N), octal \\N(NN), \\uNNNN and
    \\u{N ...}, and any other escaped character standing for itself (\\" \\\\ \\' ...).
    Interpolation (`#{`, `#@`, `#$`) and control escapes (\\c, \\C-, \\M-) are refused:
    the protobuf generator never writes them, and they would not be a plain literal.
    """
    out = bytearray()
    i, n = 0, len(body)
    while i < n:
        ch = body[i]
        if ch == "#" and i + 1 < n and body[i + 1] in "{@$":
            raise RubyLiteralError(f"interpolation {body[i:i + 2]!r} at {i}")
        if ch != "\\":
            out += ch.encode("utf-8")
            i += 1
            continue
        if i + 1 >= n:
            raise RubyLiteralError("literal ends in a backslash")
        c = body[i + 1]
        i += 2
        if c in SIMPLE_ESCAPES:
            out += SIMPLE_ESCAPES[c]
        elif c == "x":
            m = re.match(r"[0-9A-Fa-f]{1,2}", body[i:])
            if not m:
                raise RubyLiteralError(f"bad \\x escape at {i}")
            out.append(int(m.group(0), 16))
            i += len(m.group(0))
        elif c in "01234567":
            m = re.match(r"[0-7]{0,2}", body[i:])
            out.append(int(c + m.group(0), 8) & 0xFF)
            i += len(m.group(0))
        elif c == "u":
            if body[i:i + 1] == "{":
                j = body.index("}", i)
                for cp in body[i + 1:j].split():
                    out += chr(int(cp, 16)).encode("utf-8")
                i = j + 1
            else:
                m = re.match(r"[0-9A-Fa-f]{4}", body[i:])
                if not m:
                    raise RubyLiteralError(f"bad \\u escape at {i}")
                out += chr(int(m.group(0), 16)).encode("utf-8")
                i += 4
        elif c in "cCM":
            raise RubyLiteralError(f"control/meta escape \\{c} at {i - 2}")
        elif c == "\n":
            pass  # line continuation
        else:
            out += c.encode("utf-8")
    return bytes(out)


def descriptor_from_pb_rb(text):
    """The serialized FileDescriptorProto in a generated `*_pb.rb`, or None (old DSL
    format, or a `*_services_pb.rb`)."""
    m = re.search(r'^\s*descriptor_data\s*=\s*"', text, re.M)
    if not m:
        return None
    i = m.end()
    j = i
    while True:
        if j >= len(text):
            raise RubyLiteralError("unterminated descriptor_data literal")
        if text[j] == "\\":
            j += 2
            continue
        if text[j] == '"':
            break
        j += 1
    return ruby_dq_unescape(text[i:j])


# ---------------------------------------------------------------- wire decoding


class WireError(ValueError):
    pass


def varint(buf, i):
    shift = value = 0
    while True:
        if i >= len(buf):
            raise WireError("truncated varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise WireError("varint too long")


def fields(buf):
    """[(number, wire type, value)]: value is an int (varint, fixed) or bytes."""
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise WireError("field number 0")
        if wt == 0:
            v, i = varint(buf, i)
        elif wt == 1:
            v, i = int.from_bytes(buf[i:i + 8], "little"), i + 8
        elif wt == 2:
            ln, i = varint(buf, i)
            if i + ln > len(buf):
                raise WireError(f"field {num}: length {ln} runs past the end")
            v, i = bytes(buf[i:i + ln]), i + ln
        elif wt == 5:
            v, i = int.from_bytes(buf[i:i + 4], "little"), i + 4
        else:
            raise WireError(f"field {num}: wire type {wt}")
        if i > len(buf):
            raise WireError(f"field {num}: truncated")
        out.append((num, wt, v))
    return out


def descriptor_set_files(buf):
    """The FileDescriptorProto bytes of a FileDescriptorSet."""
    return [v for num, wt, v in fields(buf) if num == 1 and wt == 2]


def strings(fs, num):
    return [v.decode("utf-8") for n, wt, v in fs if n == num and wt == 2]


def one(fs, num, default=""):
    vals = [v for n, _, v in fs if n == num]
    if not vals:
        return default
    v = vals[-1]
    return v.decode("utf-8") if isinstance(v, bytes) else v


def subs(fs, num):
    return [fields(v) for n, wt, v in fs if n == num and wt == 2]


def raw(fs, num):
    vals = [v for n, wt, v in fs if n == num and wt == 2]
    return vals[-1] if vals else None


def unknown(fs, known):
    return [(n, wt, v) for n, wt, v in fs if n not in known]


def show(v):
    return f"0x{v.hex()}" if isinstance(v, bytes) else str(v)


# ---------------------------------------------------------------- rendering

LABELS = {1: "LABEL_OPTIONAL", 2: "LABEL_REQUIRED", 3: "LABEL_REPEATED"}
TYPES = {
    1: "TYPE_DOUBLE", 2: "TYPE_FLOAT", 3: "TYPE_INT64", 4: "TYPE_UINT64", 5: "TYPE_INT32",
    6: "TYPE_FIXED64", 7: "TYPE_FIXED32", 8: "TYPE_BOOL", 9: "TYPE_STRING", 10: "TYPE_GROUP",
    11: "TYPE_MESSAGE", 12: "TYPE_BYTES", 13: "TYPE_UINT32", 14: "TYPE_ENUM", 15: "TYPE_SFIXED32",
    16: "TYPE_SFIXED64", 17: "TYPE_SINT32", 18: "TYPE_SINT64",
}
FILE_OPTIONS = {
    1: "java_package", 8: "java_outer_classname", 9: "optimize_for", 10: "java_multiple_files",
    11: "go_package", 16: "cc_generic_services", 17: "java_generic_services",
    18: "py_generic_services", 20: "java_generate_equals_and_hash", 23: "deprecated",
    27: "java_string_check_utf8", 31: "cc_enable_arenas", 36: "objc_class_prefix",
    37: "csharp_namespace", 39: "swift_prefix", 40: "php_class_prefix", 41: "php_namespace",
    44: "php_metadata_namespace", 45: "ruby_package",
}
ACCESS_CONTROL = 90000  # gitlab.cells.topology_service.access_control (proto/autz.proto)
GOOGLE_API_HTTP = 72295728  # google.api.http (google/api/annotations.proto)
HTTP_RULE = {1: "selector", 2: "get", 3: "put", 4: "post", 5: "delete", 6: "patch", 7: "body",
             12: "response_body"}


def packed_or_plain_varints(fs, num):
    out = []
    for n, wt, v in fs:
        if n != num:
            continue
        if wt == 0:
            out.append(v)
        elif wt == 2:
            i = 0
            while i < len(v):
                x, i = varint(v, i)
                out.append(x)
    return out


def http_rule(buf):
    fs = fields(buf)
    parts = []
    for n, wt, v in fs:
        if n in HTTP_RULE and wt == 2:
            parts.append(f'{HTTP_RULE[n]}:"{v.decode()}"')
        elif n == 8 and wt == 2:
            c = fields(v)
            parts.append(f'custom:{{kind:"{one(c, 1)}" path:"{one(c, 2)}"}}')
        elif n == 11 and wt == 2:
            parts.append(f"additional_bindings:{{{http_rule(v)}}}")
        else:
            parts.append(f"#{n}={show(v)}")
    return " ".join(parts)


def method_options(buf, rule_names):
    """Readable form of a MethodOptions: the two options the Topology Service uses."""
    parts = []
    for n, wt, v in fields(buf):
        if n == ACCESS_CONTROL and wt == 2:
            ac = fields(v)
            rules = packed_or_plain_varints(ac, 1)
            names = [rule_names.get(r, str(r)) for r in rules]
            extra = "".join(f" #{k}={show(x)}" for k, _, x in unknown(ac, {1}))
            parts.append(f"access_control=[{','.join(names)}]{extra}")
        elif n == GOOGLE_API_HTTP and wt == 2:
            parts.append(f"google.api.http={{{http_rule(v)}}}")
        elif n == 33 and wt == 0:
            parts.append(f"deprecated={bool(v)}")
        elif n == 34 and wt == 0:
            parts.append(f"idempotency_level={v}")
        else:
            parts.append(f"#{n}={show(v)}")
    return " ".join(parts)


def options_line(prefix, buf):
    return f"{prefix} options 0x{buf.hex()}"


def field_line(prefix, f, oneofs):
    idx = one(f, 9, None)
    synthetic = bool(one(f, 17, 0))
    oneof = "" if idx is None else oneofs[idx] if idx < len(oneofs) else f"#{idx}"
    extendee = one(f, 2)
    line = (
        f"{prefix} {one(f, 3):>3} {one(f, 1)} {LABELS.get(one(f, 4, 0), one(f, 4, 0))} "
        f"{TYPES.get(one(f, 5, 0), one(f, 5, 0))} {one(f, 6)} json={one(f, 10)} "
        f"oneof={'' if synthetic else oneof} optional={synthetic}"
    )
    if synthetic:
        line += f" synthetic_oneof={oneof}"
    if extendee:
        line += f" extendee={extendee}"
    if one(f, 7, None) is not None:
        line += f" default={one(f, 7)!r}"
    for n, wt, v in unknown(f, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17}):
        line += f" #{n}={show(v)}"
    out = [line]
    opts = raw(f, 8)
    if opts is not None:
        out.append(options_line(f"{prefix} {one(f, 3):>3}", opts))
    return out


def enum_lines(prefix, e, out):
    name = f"{prefix}.{one(e, 1)}"
    for v in subs(e, 2):
        out.append(f"enum {name} value {one(v, 2, 0)} {one(v, 1)}")
        if raw(v, 3) is not None:
            out.append(options_line(f"enum {name} value {one(v, 1)}", raw(v, 3)))
        for n, wt, x in unknown(v, {1, 2, 3}):
            out.append(f"enum {name} value {one(v, 1)} #{n}={show(x)}")
    if raw(e, 3) is not None:
        out.append(options_line(f"enum {name}", raw(e, 3)))
    for r in subs(e, 4):
        out.append(f"enum {name} reserved {one(r, 1, 0)}..{one(r, 2, 0)}")
    for r in strings(e, 5):
        out.append(f"enum {name} reserved name {r}")
    for n, wt, x in unknown(e, {1, 2, 3, 4, 5}):
        out.append(f"enum {name} #{n}={show(x)}")


def message_lines(prefix, m, out):
    name = f"{prefix}.{one(m, 1)}"
    out.append(f"message {name}")
    oneofs = [one(o, 1) for o in subs(m, 8)]
    for o in subs(m, 8):
        out.append(f"message {name} oneof {one(o, 1)}")
        if raw(o, 2) is not None:
            out.append(options_line(f"message {name} oneof {one(o, 1)}", raw(o, 2)))
    for f in subs(m, 2):
        out += field_line(f"message {name} field", f, oneofs)
    for f in subs(m, 6):
        out += field_line(f"message {name} extension", f, [])
    for r in subs(m, 5):
        out.append(f"message {name} extension_range {one(r, 1, 0)}..{one(r, 2, 0)}")
    for r in subs(m, 9):
        out.append(f"message {name} reserved {one(r, 1, 0)}..{one(r, 2, 0)}")
    for r in strings(m, 10):
        out.append(f"message {name} reserved name {r}")
    if raw(m, 7) is not None:
        out.append(options_line(f"message {name}", raw(m, 7)))
    for n, wt, x in unknown(m, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}):
        out.append(f"message {name} #{n}={show(x)}")
    for e in subs(m, 4):
        enum_lines(name, e, out)
    for nested in subs(m, 3):
        message_lines(name, nested, out)


def rule_names_of(files):
    """AuthorizationRule value names, from whichever file declares the enum."""
    names = {}
    for buf in files:
        fd = fields(buf)
        for e in subs(fd, 5):
            if one(e, 1) == "AuthorizationRule":
                names.update({one(v, 2, 0): one(v, 1) for v in subs(e, 2)})
    return names


def file_lines(buf, rule_names):
    """The lines of one serialized FileDescriptorProto."""
    fd = fields(buf)
    name, pkg = one(fd, 1), one(fd, 2)
    p = f"file {name}"
    out = [f"{p} package {pkg} syntax={one(fd, 12)}"]
    out += [f"{p} import {d}" for d in strings(fd, 3)]
    deps = strings(fd, 3)
    for num, kind in ((10, "public"), (11, "weak")):
        for idx in packed_or_plain_varints(fd, num):
            out.append(f"{p} {kind} import {deps[idx] if idx < len(deps) else idx}")
    opts = raw(fd, 8)
    if opts is not None:
        out.append(options_line(p, opts))
        for n, wt, v in fields(opts):
            label = FILE_OPTIONS.get(n, f"#{n}")
            value = f'"{v.decode()}"' if wt == 2 else str(bool(v)) if n in (10, 16, 17, 18, 20, 23, 27, 31) else str(v)
            out.append(f"{p} option {label}={value}")
    for m in subs(fd, 4):
        message_lines(pkg, m, out)
    for e in subs(fd, 5):
        enum_lines(pkg, e, out)
    for f in subs(fd, 7):
        out += field_line(f"extension {pkg}", f, [])
    for s in subs(fd, 6):
        svc = f"service {pkg}.{one(s, 1)}"
        out.append(svc)
        if raw(s, 3) is not None:
            out.append(options_line(svc, raw(s, 3)))
        for m in subs(s, 2):
            meth = f"{svc} method {one(m, 1)}"
            out.append(
                f"{meth} {one(m, 2)} -> {one(m, 3)} client_streaming={bool(one(m, 5, 0))} "
                f"server_streaming={bool(one(m, 6, 0))}"
            )
            mo = raw(m, 4)
            if mo is not None:
                out.append(options_line(meth, mo))
                out.append(f"{meth} decoded options {method_options(mo, rule_names)}")
            for n, wt, x in unknown(m, {1, 2, 3, 4, 5, 6}):
                out.append(f"{meth} #{n}={show(x)}")
        for n, wt, x in unknown(s, {1, 2, 3}):
            out.append(f"{svc} #{n}={show(x)}")
    for n, wt, x in unknown(fd, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}):
        out.append(f"{p} #{n}={show(x)}")
    return out


def file_name(buf):
    return one(fields(buf), 1)


def method_option_summary(files, rule_names):
    """(method path, options hex, decoded) for every method with options."""
    out = []
    for buf in files:
        fd = fields(buf)
        for s in subs(fd, 6):
            for m in subs(s, 2):
                mo = raw(m, 4)
                if mo is not None:
                    out.append((f"/{one(fd, 2)}.{one(s, 1)}/{one(m, 1)}", mo.hex(), method_options(mo, rule_names)))
    return out
