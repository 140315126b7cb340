"""The text form reads every name back unchanged (``mi.parse(str(g)) == g``), and a graph file's
version must be the integer the reader knows."""

from __future__ import annotations

import json

import pytest

import mirage as mi
from mirage import errors
from mirage.mugraph.serialize import dumps, loads

AWKWARD_NAMES = [
    'a"b', "a'b", "a\nb", "a\r\nb", "tab\there", "back\\slash", "ends with \\", "\\n not a newline",
    '\\"', '"', '""', "x : y {", "}", "%1 = relu(%0)", 'name="q" forloop_dim=1', "(1,2)", ")",
    " lead and trail ", "é ü 日本 🙂", "\u2028line\u2029sep\x85", "\x0b\x0c\x1c\x1d\x1e", "\x00\x07",
    "\ud800", "return %0", "kernel_graph", "",
]


def graph(name: str, input_name: str):
    g = mi.new_kernel_graph(name)
    a = g.new_input((4, 8), mi.float32, name=input_name)
    b = g.new_input((8, 16), mi.float32, name=input_name + "2")
    g.mark_output(g.relu(g.matmul(a, b)))
    return g.freeze()


@pytest.mark.parametrize("name", AWKWARD_NAMES, ids=[ascii(n) for n in AWKWARD_NAMES])
def test_every_name_round_trips_through_the_text_form(name):
    g = graph(name, name)
    text = str(g)
    parsed = mi.parse(text)
    assert parsed == g
    assert parsed.name == name
    assert parsed.nodes[0].attrs.name == name
    assert len(text.splitlines()) == len(g.nodes) + 3  # header, nodes, return, "}": no name breaks a line


def test_names_are_written_as_json_strings():
    text = str(graph('say "hi"\n', "x"))
    assert text.splitlines()[0] == 'kernel_graph "say \\"hi\\"\\n" {'


def test_a_bad_escape_is_a_parse_error():
    text = str(graph("g", "x")).replace('name="x"', 'name="a\\qb"')
    with pytest.raises(errors.ParseError, match="cannot read string"):
        mi.parse(text)


@pytest.mark.parametrize("version", ["1", 1.5, True, None, [1]])
def test_a_version_that_is_not_an_integer_says_so(version):
    doc = json.loads(dumps(graph("g", "x")))
    doc["version"] = version
    with pytest.raises(errors.SerializationError) as info:
        loads(json.dumps(doc))
    message = str(info.value)
    assert "must be the integer 1" in message
    assert repr(version) in message
    assert "this mirage reads version" not in message


def test_an_unknown_integer_version_is_not_supported():
    doc = json.loads(dumps(graph("g", "x")))
    doc["version"] = 2
    with pytest.raises(errors.SerializationError, match="version 2 is not supported"):
        loads(json.dumps(doc))
