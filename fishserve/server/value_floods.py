"""Refuse request bodies with more values than any valid request has, before parsing them.

Building millions of small objects holds the GIL, and every running stream stalls meanwhile:
a 32 MiB JSON body of ``[1,1,1,...]`` took ~1.5 s in `json.loads`, 8 MiB of empty msgpack
maps ~1.2 s in `ormsgpack.unpackb` (measured on the 2-core development machine). A valid
request has a few dozen fields and at most 8 references, so the bodies' values are counted
first, at a cost bounded by the limit:

* JSON: values are separated by commas, and a valid request's commas are those of its texts
  (`max_text_length` characters, and 8 reference transcripts of `MAX_REFERENCE_TEXT`) plus
  one per field or list item; `bytes.count` finds them in a few ms for 32 MiB.
* msgpack: every object starts with a type byte that gives its size or its number of items
  (the msgpack specification, github.com/msgpack/msgpack/blob/master/spec.md), so a walk over
  the type bytes counts objects without building them, skipping strings and binary data, and
  stops at the limit.
"""

from __future__ import annotations

from fishserve.server.errors import ApiError
from fishserve.server.schemas import MAX_REFERENCE_TEXT

__all__ = [
    "JSON_TYPES",
    "MSGPACK_TYPES",
    "SPARE_VALUES",
    "json_comma_limit",
    "refuse_value_floods",
]

# Content types read as JSON (also none given) and as msgpack (spec §7.2).
JSON_TYPES = ("application/json", "")
MSGPACK_TYPES = ("application/msgpack", "application/x-msgpack")

# Values a body may hold beyond the commas of its texts: one per field or list item of the
# largest valid request (8 references of 3 fields, ~20 fields), with room to spare.
SPARE_VALUES = 1000

# msgpack type byte -> (bytes of a length field, fixed payload bytes, items per length unit)
# for the types whose size is not in the type byte itself.
_SIZED = {
    0xC4: (1, 0, 0), 0xC5: (2, 0, 0), 0xC6: (4, 0, 0),  # bin 8/16/32
    0xC7: (1, 1, 0), 0xC8: (2, 1, 0), 0xC9: (4, 1, 0),  # ext 8/16/32 (+ type byte)
    0xD9: (1, 0, 0), 0xDA: (2, 0, 0), 0xDB: (4, 0, 0),  # str 8/16/32
    0xDC: (2, 0, 1), 0xDD: (4, 0, 1),  # array 16/32
    0xDE: (2, 0, 2), 0xDF: (4, 0, 2),  # map 16/32 (key and value per entry)
}  # fmt: skip
# msgpack type byte -> payload bytes, for fixed-size types.
_FIXED = {
    0xC0: 0, 0xC2: 0, 0xC3: 0,  # nil, false, true
    0xCA: 4, 0xCB: 8,  # float 32/64
    0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8,  # uint 8-64
    0xD0: 1, 0xD1: 2, 0xD2: 4, 0xD3: 8,  # int 8-64
    0xD4: 2, 0xD5: 3, 0xD6: 5, 0xD7: 9, 0xD8: 17,  # fixext 1-16 (+ type byte)
}  # fmt: skip


def json_comma_limit(max_text_length: int) -> int:
    """Commas a valid JSON request may hold (see the module docstring)."""
    return max_text_length + 8 * MAX_REFERENCE_TEXT + SPARE_VALUES


def refuse_value_floods(raw: bytes, kind: str, max_text_length: int) -> None:
    """Refuse a JSON or msgpack body (`kind`: its content type) with more values than a
    valid request has; other bodies pass (their parser refuses them).

    Raises:
        ApiError 400: the body holds too many values.
    """
    if kind in MSGPACK_TYPES:
        count, end = _msgpack_walk(raw, SPARE_VALUES + 1)
        if count > SPARE_VALUES:
            raise ApiError(
                400,
                "request body holds more msgpack objects than a request has "
                f"(more than {SPARE_VALUES})",
            )
        if end is not None and end < len(raw):  # ormsgpack reads the first object only
            raise ApiError(400, f"request body has {len(raw) - end} bytes after its msgpack object")
        return
    if kind not in JSON_TYPES:
        return
    limit = json_comma_limit(max_text_length)
    if len(raw) > limit and (count := raw.count(b",")) > limit:
        raise ApiError(
            400,
            f"request body holds more JSON values than a request has ({count} commas; "
            f"at most {limit})",
        )


def _msgpack_walk(data: bytes, stop: int) -> tuple[int, int | None]:
    """Objects of the first msgpack object in `data`, counted up to `stop` (a truncated or
    invalid body as far as it goes: its parser reports it), and the offset where that object
    ends (None: not reached, the data being truncated, invalid or the count stopped)."""
    pos, pending, count = 0, 1, 0
    while pending and pos < len(data) and count < stop:
        head = data[pos]
        pos, pending, count = pos + 1, pending - 1, count + 1
        if head <= 0x7F or head >= 0xE0:  # positive / negative fixint
            continue
        if head <= 0x8F:  # fixmap
            pending += 2 * (head & 0x0F)
        elif head <= 0x9F:  # fixarray
            pending += head & 0x0F
        elif head <= 0xBF:  # fixstr
            pos += head & 0x1F
        elif head in _FIXED:
            pos += _FIXED[head]
        elif head in _SIZED:
            width, extra, items = _SIZED[head]
            size = int.from_bytes(data[pos : pos + width], "big")
            pos += width + extra
            if items:
                pending += items * size
            else:
                pos += size
        else:  # 0xC1: never used; the parser refuses it
            return count, None
    return count, (pos if not pending and pos <= len(data) else None)
