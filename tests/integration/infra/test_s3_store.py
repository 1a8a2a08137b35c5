"""The local S3 store (`infra.s3_store`): with nothing configured, what one command wrote to its
embedded endpoint is there for the next, in a folder under HETFLOW_HOME; two commands at once
each keep their own writes; `hetflow data ls` lists what is there.

Each "command" here is a process of its own (moto's state lives in its process), run with no
AWS variable set and HETFLOW_HOME pointing at the test's folder."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.timeout(180)


def test_data_ls_lists_a_configured_endpoint(digits, capsys):
    """With AWS_ENDPOINT_URL set (the local stack's, say), `data ls` lists there, not the store."""
    from hetflow.cli import main

    bucket = digits.url.removeprefix("s3://").split("/", 1)[0]
    for argv in (["data", "ls", f"s3://{bucket}"], ["data", "ls"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "S3 at http://127.0.0.1:" in out.splitlines()[0]
        assert f"\n{digits.url}  tabular (64 features, 10 classes)  samples: train " in out
