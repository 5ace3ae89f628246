"""The msgpack object count that refuses floods before parsing equals a count of the objects
the parser builds, for every msgpack type."""

from __future__ import annotations

import ormsgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fishserve.server.errors import ApiError
from fishserve.server.value_floods import (
    SPARE_VALUES,
    _msgpack_walk,
    json_comma_limit,
    refuse_value_floods,
)

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=70_000)  # bin 8, 16 and 32
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: st.lists(inner, max_size=20) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=60,
)


def objects(value: object) -> int:
    """Objects in `value` as msgpack counts them (a map entry: its key and its value)."""
    if isinstance(value, list):
        return 1 + sum(objects(item) for item in value)
    if isinstance(value, dict):
        return 1 + sum(objects(k) + objects(v) for k, v in value.items())
    return 1


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_the_walk_counts_every_object_and_ends_where_the_object_does(value):
    packed = ormsgpack.packb(value)
    assert _msgpack_walk(packed, 10**9) == (objects(value), len(packed))
    assert _msgpack_walk(packed + b"\xc0", 10**9)[0] == objects(value)  # the first object


@pytest.mark.parametrize(
    "data",
    [
        b"\xd4\x01\x02",  # fixext 1
        b"\xc7\x03\x05abc",  # ext 8
        b"\xdc\x00\x02\x01\x02",  # array 16
        b"\xde\x00\x01\xa1k\xc0",  # map 16
        b"\xdb\x00\x00\x00\x02hi",  # str 32
    ],
)
def test_sized_types_count_one_object_each_plus_items(data):
    expected = {b"\xdc": 3, b"\xde": 3}.get(data[:1], 1)
    assert _msgpack_walk(data, 100)[0] == expected


def test_the_walk_stops_at_its_limit_and_at_truncated_or_invalid_data():
    flood = ormsgpack.packb([None] * 10**6)
    assert _msgpack_walk(flood, 50)[0] == 50
    assert _msgpack_walk(flood[:10], 10**9)[0] == 10 - 5 + 1  # array32 head, 5 nils
    assert _msgpack_walk(b"\x92\xc1\x01", 100)[0] == 2  # 0xC1 is never used


def test_refusals_name_the_limit():
    with pytest.raises(ApiError, match=f"more than {SPARE_VALUES}"):
        refuse_value_floods(ormsgpack.packb([0] * SPARE_VALUES), "application/msgpack", 10)
    refuse_value_floods(ormsgpack.packb([0] * (SPARE_VALUES - 1)), "application/msgpack", 10)
    limit = json_comma_limit(10)
    with pytest.raises(ApiError, match=f"at most {limit}"):
        refuse_value_floods(b"," * (limit + 1), "application/json", 10)
    refuse_value_floods(b"," * limit, "application/json", 10)
    refuse_value_floods(b"," * (limit + 1), "text/plain", 10)  # its parser refuses it


def test_bytes_after_the_msgpack_object_are_refused():
    """ormsgpack reads the first object and ignored the rest: two objects back to back were
    served as the first."""
    one = ormsgpack.packb({"text": "hi", "max_new_tokens": 4})
    refuse_value_floods(one, "application/msgpack", 10)
    for extra in (ormsgpack.packb({"text": "OTHER"}), b"\x00"):
        with pytest.raises(ApiError, match=f"{len(extra)} bytes after its msgpack object"):
            refuse_value_floods(one + extra, "application/msgpack", 10)
    refuse_value_floods(one[:-1], "application/msgpack", 10)  # truncated: the parser's 400
