"""A dataset on a storage server that takes 50 ms a request, read without a disk cache: the
verdict of loader.stats() names storage, in a fresh process as a user's script runs it, and
counts the requests; the same records from local shards are not a storage wait."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import shardfeed
    from shardfeed.storage.remote import set_storage_options

    url, options = sys.argv[1], json.loads(sys.argv[2])
    if options:
        set_storage_options("s3://", **options)
    with shardfeed.Dataset(url) as ds, shardfeed.Loader(
            ds, batch_size=8, shuffle=True, seed=1, transform=None, num_threads=2,
            rank=0, world_size=1) as loader:
        for epoch in range(2):
            if epoch == 1:
                loader.stats()  # the window: the second epoch, opening and indexes done
            loader.set_epoch(epoch)
            for batch in loader:
                pass
        stats = loader.stats()
    print(json.dumps({"window": stats.window.to_dict(), "verdict": stats.verdict}))
    """
)


def _user_run(url: str, options: dict[str, Any]) -> dict[str, Any]:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, url, json.dumps(options)],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_slow_storage_server_is_named(
    s3_server: Any, records_dataset: Callable[[int, int], Path]
) -> None:
    folder = records_dataset(240, 4)
    url = s3_server.upload_folder(folder)
    s3_server.latency_seconds = 0.05
    options = {"key": "testing-key", "secret": "testing-secret",
               "client_kwargs": {"endpoint_url": s3_server.endpoint_url}}
    result = _user_run(url, options)
    window = result["window"]
    assert "waiting on storage takes" in result["verdict"], result["verdict"]
    assert "cache" in result["verdict"]  # the fix it names
    assert window["requests"] > 0 and window["storage"] > 0, window
    local = _user_run(str(folder), {})
    assert "storage" not in local["verdict"], local["verdict"]
    assert local["window"]["requests"] == 0
