"""A ZLIB-compressed TFRecord file (TensorFlow's ``compression_type="ZLIB"``) is refused
with a fix that works: the command the message gives, run as written, gives a file that
reads; the message used to say ``gunzip -c``, which cannot read ZLIB."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import shardfeed
from shardfeed.cli.main import main
from shardfeed.errors import FormatError
from shardfeed.format.writer import ShardWriter


def _names(path: Path) -> list[bytes]:
    ds = shardfeed.Dataset(str(path))
    try:
        return [ds[i]["name"] for i in range(len(ds))]
    finally:
        ds.close()


def test_the_zlib_hint_is_a_command_that_works(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plain = tmp_path / "written" / "orig.tfrecord"
    plain.parent.mkdir()
    with ShardWriter(str(plain)) as writer:
        for i in range(5):
            writer.write_example({"index": [i], "name": f"record {i}".encode()})
    (tmp_path / "f.tfrecord").write_bytes(zlib.compress(plain.read_bytes()))

    assert main(["index", str(tmp_path / "f.tfrecord")]) == 1
    message = capsys.readouterr().err
    with pytest.raises(FormatError) as info:
        shardfeed.Dataset(str(tmp_path / "f.tfrecord"))
    assert str(info.value) in message and "ZLIB-compressed" in message
    assert "gunzip -c" not in message

    # the first fix, run as the message writes it, in the file's folder
    command = re.search(r"`(python3 -c .*?)`", message)
    assert command is not None, message
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ.get('PATH', '')}"}
    subprocess.run(command.group(1), shell=True, cwd=tmp_path, env=env, check=True,
                   timeout=120)
    expected = [f"record {i}".encode() for i in range(5)]
    assert _names(tmp_path / "plain.tfrecord") == expected

    # the second: re-pack it
    assert "shardfeed pack FILE OUT --from-tfrecord" in message
    assert main(["pack", str(tmp_path / "f.tfrecord"), str(tmp_path / "out"),
                 "--from-tfrecord", "--no-progress"]) == 0
    assert sorted(_names(tmp_path / "out")) == expected

    # what the message said before does not read ZLIB
    gunzip = shutil.which("gunzip")
    if gunzip is not None:
        done = subprocess.run([gunzip, "-c", str(tmp_path / "f.tfrecord")],
                              capture_output=True, timeout=60, check=False)
        assert done.returncode != 0
