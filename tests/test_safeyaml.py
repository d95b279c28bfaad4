"""The safe reader of user files: regular files only, never blocking, a hard byte cap; YAML
limits checked on the event stream; YAML 1.2 decimal numbers, YAML 1.1 spellings refused."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.exceptions import GridError
from orchestrator.safeyaml import MAX_DEPTH, MAX_NODES, load_yaml, loads, read_capped


def test_regular_file_is_read_whole(tmp_path: Path) -> None:
    f = tmp_path / "g.yaml"
    f.write_bytes(b"a: 1\n" * 10)
    assert read_capped(f) == b"a: 1\n" * 10


@pytest.mark.parametrize("target, kind", [("/dev/zero", "a character device"),
                                          ("/dev/null", "a character device")])
def test_devices_and_links_to_them_are_refused(tmp_path: Path, target: str, kind: str) -> None:
    link = tmp_path / "grid.yaml"
    link.symlink_to(target)
    for path in (Path(target), link):
        with pytest.raises(GridError, match=f"is {kind}, not a regular file"):
            read_capped(path)


def test_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GridError, match="is a directory, not a regular file"):
        read_capped(tmp_path)


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    # In a child process with a timeout: a reader that opened the FIFO would wait for a writer
    # for ever, and must not take the test run with it.
    fifo = tmp_path / "grid.yaml"
    os.mkfifo(fifo)
    code = ("import sys; from orchestrator.safeyaml import load_yaml\n"
            "from orchestrator.exceptions import GridError\n"
            "try:\n    load_yaml(sys.argv[1])\nexcept GridError as e:\n    print(e)\n")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(fifo)], capture_output=True, text=True,
                          timeout=60, check=True)
    assert "is a FIFO (named pipe), not a regular file" in proc.stdout
    assert time.monotonic() - started < 30


def test_byte_cap_holds_whatever_the_size_says(tmp_path: Path) -> None:
    f = tmp_path / "big.yaml"
    f.write_bytes(b"#" * 5000)
    assert len(read_capped(f, max_bytes=5000)) == 5000
    with pytest.raises(GridError, match="over the 4999-byte limit"):
        read_capped(f, max_bytes=4999)


@pytest.mark.parametrize("text, meaning", [
    ("1:30", "base-60 (sexagesimal) number spelling (YAML 1.1 reads it as 90)"),
    ("-1:30:00", "reads it as -5400"),
    ("010", "octal-looking (leading zero) number spelling (YAML 1.1 reads it as 8)"),
    ("09", "octal-looking (leading zero) number spelling (YAML versions read it differently)"),
    ("0x10", "hexadecimal number spelling (YAML 1.1 reads it as 16)"),
    ("0o17", "octal-looking"),
    ("0b101", "binary number spelling (YAML 1.1 reads it as 5)"),
    ("1_000", "underscore-grouped number spelling (YAML 1.1 reads it as 1000)"),
    ("1_000.5", "underscore-grouped"),
])
def test_yaml11_number_spellings_are_refused(text: str, meaning: str) -> None:
    with pytest.raises(GridError, match="write the number in plain decimal") as exc:
        loads(f"steps: {text}\n", file="g.yaml")
    assert meaning in str(exc.value) and "g.yaml:1: steps:" in str(exc.value)
    # Quoted, it is text: nothing to refuse.
    assert loads(f"steps: '{text}'\n")[0] == {"steps": text}


@pytest.mark.parametrize("text, value", [
    ("10", 10), ("-3", -3), ("0", 0), ("+7", 7), ("1.5", 1.5), ("2e-3", 2e-3), ("1.0e+3", 1000.0),
    (".5", 0.5), ("-.inf", float("-inf")), ("true", True), ("null", None), ("~", None),
    ("2001-12-14", "2001-12-14"), ("v1:30", "v1:30"), ("0.5", 0.5),
])
def test_decimal_numbers_and_other_scalars(text: str, value: object) -> None:
    assert loads(f"k: {text}\n")[0] == {"k": value}


def test_nan_is_still_a_float_for_the_schema_to_refuse() -> None:
    got = loads("k: .nan\n")[0]["k"]
    assert isinstance(got, float) and math.isnan(got)


def test_depth_is_refused_before_anything_recurses() -> None:
    ok = "x: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"  # + the top mapping
    assert loads(ok)[0] is not None
    # A million levels would crash libyaml's composer (segfault): refused from the events.
    for depth in (MAX_DEPTH + 1, 1_000_000):
        with pytest.raises(GridError, match=f"nested more than {MAX_DEPTH} levels deep"):
            loads("x: " + "[" * depth + "]" * depth + "\n")


def test_deep_plain_mapping_is_not_called_an_alias_bomb() -> None:
    text = "x: " + "{a: " * 100 + "1" + "}" * 100 + "\n"
    with pytest.raises(GridError) as exc:
        loads(text)
    assert "nested more than" in str(exc.value) and "alias" not in str(exc.value)


def test_alias_bomb_is_called_one() -> None:
    text = "a: &a [x,x,x,x,x,x,x,x,x,x]\n"
    for i, name in enumerate("bcde"):
        prev = "abcd"[i]
        text += f"{name}: &{name} [" + ",".join([f"*{prev}"] * 10) + "]\n"
    with pytest.raises(GridError, match="alias bomb"):
        loads(text)


def test_too_many_values_are_refused_fast(tmp_path: Path) -> None:
    f = tmp_path / "seeds.yaml"
    f.write_text("seeds: [" + ",".join(str(i) for i in range(150_000)) + "]\n")
    # CPU time of this thread (stable on a loaded machine; the process's would count threads
    # an earlier test left running in this worker, tests/grid/test_grid_limits.py).
    cpu, wall = time.thread_time(), time.monotonic()
    with pytest.raises(GridError, match=f"holds more than {MAX_NODES} values"):
        load_yaml(f)
    cpu, wall = time.thread_time() - cpu, time.monotonic() - wall
    assert cpu < 2.0 and wall < 30, (cpu, wall)


def test_merge_keys_only_where_allowed(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("base: &b {x: 1}\nitem: {<<: *b, y: 2}\n")
    with pytest.raises(GridError, match="merge keys"):
        load_yaml(f)
    assert load_yaml(f, merge=True)[0]["item"] == {"x": 1, "y": 2}


def test_bom_and_crlf_are_accepted(tmp_path: Path) -> None:
    f = tmp_path / "g.yaml"
    f.write_bytes(b"\xef\xbb\xbfname: a\r\nsteps: 20\r\nseeds: [0, 1]\r\n")
    data, lines = load_yaml(f)
    assert data == {"name": "a", "steps": 20, "seeds": [0, 1]} and lines[("steps",)] == 2
