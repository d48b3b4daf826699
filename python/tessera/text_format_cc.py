"""Text format as the C++ protobuf library (3.21) prints it, byte for byte.

``google.protobuf.text_format`` prints floats as the shortest repr (``0.0``, ``3.4641016``)
where C++ ``TextFormat`` uses ``SimpleFtoa`` (``%.6g``, else ``%.9g``: ``0``, ``3.46410155``)
and ``SimpleDtoa`` (``%.15g``, else ``%.17g``) -- the same values, other bytes. Printing like
C++ makes a model file written here identical to the one ``tessera_program --model_out`` writes
for the same model, so the two can be compared with ``diff``.

Supports the messages of proto/*.proto (no map fields, groups or extensions).
"""

import math
import struct
from fractions import Fraction

from google.protobuf import descriptor

__all__ = ["message_to_string", "format_float", "format_double"]

_FD = descriptor.FieldDescriptor


def _f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _f32_step(v, up):
    """The float32 next to float32 value `v` (finite, not the largest) towards +inf if `up`."""
    bits = struct.unpack("<I", struct.pack("<f", v))[0]
    if v == 0.0:
        bits = 0x00000001 if up else 0x80000001
    elif (v > 0) == up:
        bits += 1
    else:
        bits -= 1
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def _strtof(text):
    """The float32 nearest to decimal `text`, ties to even (what C's strtof returns)."""
    q = Fraction(text)
    guess = _f32(float(q))  # via double: may be off by one float32 when rounding twice
    if math.isinf(guess):
        return guess
    best = guess
    for cand in (_f32_step(guess, False), _f32_step(guess, True)):
        if math.isinf(cand):
            continue
        d_best, d_cand = abs(Fraction(best) - q), abs(Fraction(cand) - q)
        if d_cand < d_best or (d_cand == d_best and
                               struct.unpack("<I", struct.pack("<f", cand))[0] % 2 == 0):
            best = cand
    return best


def format_float(v):
    """A float field's value as C++ SimpleFtoa prints it."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = "%.6g" % v
    if _strtof(text) != v:
        text = "%.9g" % v
    return text


def format_double(v):
    """A double field's value as C++ SimpleDtoa prints it."""
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    text = "%.15g" % v
    if float(text) != v:
        text = "%.17g" % v
    return text


_ESCAPES = {ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord('"'): '\\"',
            ord("'"): "\\'", ord("\\"): "\\\\"}


def _escape(data):
    """C++ CEscape: the escapes above, other bytes outside 0x20..0x7e as 3-digit octal."""
    out = []
    for b in data:
        if b in _ESCAPES:
            out.append(_ESCAPES[b])
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        else:
            out.append("\\%03o" % b)
    return "".join(out)


def _scalar(field, value):
    t = field.type
    if t == _FD.TYPE_FLOAT:
        return format_float(value)
    if t == _FD.TYPE_DOUBLE:
        return format_double(value)
    if t == _FD.TYPE_BOOL:
        return "true" if value else "false"
    if t == _FD.TYPE_ENUM:
        v = field.enum_type.values_by_number.get(value)
        return v.name if v is not None else str(value)
    if t == _FD.TYPE_STRING:
        return '"%s"' % _escape(value.encode("utf-8"))
    if t == _FD.TYPE_BYTES:
        return '"%s"' % _escape(value)
    return str(value)


def _print(message, indent, out):
    pad = "  " * indent
    for field, value in message.ListFields():
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            raise NotImplementedError("map field %s" % field.full_name)
        values = value if field.label == _FD.LABEL_REPEATED else [value]
        for v in values:
            if field.type in (_FD.TYPE_MESSAGE, _FD.TYPE_GROUP):
                out.append("%s%s {\n" % (pad, field.name))
                _print(v, indent + 1, out)
                out.append("%s}\n" % pad)
            else:
                out.append("%s%s: %s\n" % (pad, field.name, _scalar(field, v)))


def message_to_string(message):
    """The text format of `message` exactly as C++ TextFormat::PrintToString writes it."""
    out = []
    _print(message, 0, out)
    return "".join(out)
