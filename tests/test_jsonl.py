"""The one JSONL reader: one error rule for every file, and the torn last line of a file being appended to."""

import pytest

from rlkit.errors import UserError
from rlkit.jsonl import numbered_records, read_records


def write(tmp_path, data: bytes):
    path = tmp_path / "f.jsonl"
    path.write_bytes(data)
    return path


def test_numbered_objects_skip_blank_lines(tmp_path):
    path = write(tmp_path, b'{"a": 1}\n\n  \n{"b": "\xc3\xa9"}\n')
    assert list(numbered_records(path)) == [(1, {"a": 1}), (4, {"b": "é"})]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"a": 1}\n{"a": \n', "line 2 is not valid JSON (Expecting value, column 6)"),
        (b'{"a": 1}\n[1, 2]\n', "line 2 is a JSON list, not an object"),
        (b'{"a": "\xff"}\n', "line 1 is not UTF-8 text"),
        (b'{"a": ' + b"[" * 100_000 + b"\n", "line 1 is nested too deeply to read"),
        (b'{"a": ' + b"9" * 5000 + b"}\n", "line 1: Exceeds the limit (4300 digits) for integer string conversion: value has 5000 digits"),
    ],
)
def test_a_bad_line_is_one_user_error_naming_file_and_line(tmp_path, data, message):
    path = write(tmp_path, data)
    with pytest.raises(UserError) as e:
        read_records(path)
    assert str(e.value) == f"{path}: {message}"


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(UserError, match=r"none\.jsonl: no such file$"):
        read_records(tmp_path / "none.jsonl")
    assert read_records(tmp_path / "none.jsonl", missing_ok=True) == []
    with pytest.raises(UserError, match="is a directory, not a JSONL file"):
        read_records(tmp_path)


def test_a_torn_last_line_is_an_error_unless_asked(tmp_path, caplog):
    path = write(tmp_path, b'{"a": 1}\n{"a": 2')
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        read_records(path)
    assert read_records(path, torn_tail="drop") == [{"a": 1}]
    assert "dropping a half-written last line" in caplog.text
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2'  # drop reads only


def test_only_the_last_line_may_be_torn(tmp_path):
    path = write(tmp_path, b'{"a": 1\n{"a": 2}\n')
    with pytest.raises(UserError, match="line 1 is not valid JSON"):
        read_records(path, torn_tail="drop")


def test_cut_leaves_whole_lines_to_append_to(tmp_path):
    torn = write(tmp_path, b'{"a": 1}\n{"a": 2')
    assert read_records(torn, torn_tail="cut") == [{"a": 1}]
    assert torn.read_bytes() == b'{"a": 1}\n'
    unterminated = tmp_path / "g.jsonl"
    unterminated.write_bytes(b'{"a": 1}\n{"a": 2}')  # a whole record missing only its newline is kept
    assert read_records(unterminated, torn_tail="cut") == [{"a": 1}, {"a": 2}]
    assert unterminated.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
