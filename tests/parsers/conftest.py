"""``json_library``: run a parser test with each JSON library sentinel can decode with."""

from __future__ import annotations

import importlib.util
import json

import pytest

from sentinel.parsing import fields

# Without orjson (the optional ``fast`` extra) the tests run with the stdlib alone;
# test_json_libraries.py then says, once, that orjson was skipped.
JSON_LIBRARIES = ["json", "orjson"] if importlib.util.find_spec("orjson") else ["json"]


@pytest.fixture(params=JSON_LIBRARIES)
def json_library(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Decode with the stdlib, then with orjson.

    Whichever is installed is the one sentinel uses; a test that takes this
    fixture runs both ways, since a line must give the same samples either way.
    """
    if request.param == "orjson":
        monkeypatch.setattr(fields, "loads", fields._orjson_loads)
        monkeypatch.setattr(fields, "decode_prefix", fields._orjson_decode_prefix)
    else:
        monkeypatch.setattr(fields, "loads", json.loads)
        monkeypatch.setattr(fields, "decode_prefix", fields._STDLIB_DECODER.raw_decode)
    return str(request.param)
