"""``shardfeed ... | head``: a reader that closes the pipe early ends the command quietly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from shardfeed.format.example import encode_example
from shardfeed.format.writer import ShardWriter

RECORDS = 3000  # inspect's output of them is several times a pipe's 64 KiB buffer


@pytest.fixture(scope="module")
def many_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pipe") / "many.tfrecord"
    with ShardWriter(path) as writer:
        for i in range(RECORDS):
            writer.write(encode_example({"index": i, "name": f"record {i}"}))
    return path


@pytest.mark.parametrize("output", [[], ["--json"]])
def test_inspect_into_head_exits_quietly(many_records: Path, output: list[str]) -> None:
    shardfeed = subprocess.Popen(
        [sys.executable, "-m", "shardfeed", "inspect", str(many_records), "--records",
         str(RECORDS), *output],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert shardfeed.stdout is not None and shardfeed.stderr is not None
    head = subprocess.run(["head", "-n", "1"], stdin=shardfeed.stdout, capture_output=True,
                          timeout=120, check=False)
    shardfeed.stdout.close()  # only head holds the read end now; it exits after one line
    errors = shardfeed.stderr.read().decode()
    shardfeed.stderr.close()
    code = shardfeed.wait(timeout=120)
    assert head.stdout.decode().startswith("{" if output else "dataset")
    assert errors == ""  # no BrokenPipeError, no "Exception ignored"
    assert code == 141  # 128 + SIGPIPE, as a shell reports a command stopped by its pipe
