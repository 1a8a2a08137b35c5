"""The local S3 store (`infra.s3_store`): with nothing configured, what one command wrote to its
embedded endpoint is there for the next, in a folder under HETFLOW_HOME; two commands at once
each keep their own writes; `hetflow data ls` lists what is there.

Each "command" here is a process of its own (moto's state lives in its process), run with no
AWS variable set and HETFLOW_HOME pointing at the test's folder."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from tests.procs import run_cli

pytestmark = pytest.mark.timeout(180)


def _env(home) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "MLFLOW_", "PREFECT_API", "HTTP_PROXY", "HTTPS_PROXY"))
    }
    env.update(HETFLOW_HOME=str(home), PREFECT_HOME=str(home / "prefect"))
    return env


def _command(home, body: str, wait_for=None) -> subprocess.Popen:
    """A process that runs `body` inside `local_s3_endpoint` (`s3`: a boto3 client to it)."""
    code = textwrap.dedent(
        """
        import os, pathlib, sys, time, boto3
        from hetflow.infra.s3 import local_s3_endpoint
        with local_s3_endpoint("s3://my-bucket/x") as endpoint:
            s3 = boto3.client("s3", endpoint_url=endpoint)
            def wait(path):
                while not pathlib.Path(path).exists():
                    time.sleep(0.05)
        """
    ) + textwrap.indent(textwrap.dedent(body), "    ")
    return subprocess.Popen(
        [sys.executable, "-c", code],
        env=_env(home),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _done(proc: subprocess.Popen, stderr: bool = False) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    return err if stderr else out


def test_what_one_process_wrote_the_next_reads_and_deletes(tmp_path):
    home = tmp_path / "home"
    out = _done(
        _command(
            home,
            """
            s3.create_bucket(Bucket="my-bucket")
            s3.put_object(Bucket="my-bucket", Key="x/a.bin", Body=b"first")
            s3.put_object(Bucket="my-bucket", Key="x/sub/b.bin", Body=b"second")
            """,
        )
    )
    assert "objects kept in" in out and "2 objects written" in out
    assert (home / "s3/my-bucket/x/a.bin").read_bytes() == b"first"
    # a new process, a new moto: the objects are there, and its delete and overwrite are kept
    out = _done(
        _command(
            home,
            """
            assert s3.get_object(Bucket="my-bucket", Key="x/a.bin")["Body"].read() == b"first"
            s3.delete_object(Bucket="my-bucket", Key="x/sub/b.bin")
            s3.put_object(Bucket="my-bucket", Key="x/a.bin", Body=b"replaced")
            """,
        )
    )
    assert "1 objects written, 1 deleted" in out
    assert (home / "s3/my-bucket/x/a.bin").read_bytes() == b"replaced"
    assert not (home / "s3/my-bucket/x/sub").exists()  # its emptied folder goes too
    # a process that only reads writes nothing back
    out = _done(_command(home, 's3.get_object(Bucket="my-bucket", Key="x/a.bin")'))
    assert "written" not in out


def test_two_processes_at_once_each_keep_their_own_writes(tmp_path):
    home, go = tmp_path / "home", tmp_path / "go"
    _done(_command(home, 's3.create_bucket(Bucket="my-bucket")'))
    first = _command(
        home,
        f"""
        s3.put_object(Bucket="my-bucket", Key="x/first", Body=b"1")
        wait({str(go)!r})  # ends after the second one has saved
        """,
    )
    time.sleep(0.5)
    _done(_command(home, 's3.put_object(Bucket="my-bucket", Key="x/second", Body=b"2")'))
    assert (home / "s3/my-bucket/x/second").exists()
    go.touch()
    _done(first)
    assert (home / "s3/my-bucket/x/first").read_bytes() == b"1"
    assert (home / "s3/my-bucket/x/second").read_bytes() == b"2"  # not lost to the first's save


def test_keys_that_are_no_file_path_are_served_and_named_not_kept(tmp_path):
    home = tmp_path / "home"
    err = _done(
        _command(
            home,
            """
            s3.create_bucket(Bucket="my-bucket")
            s3.put_object(Bucket="my-bucket", Key="x//double", Body=b"no")
            s3.put_object(Bucket="my-bucket", Key="x/dir/", Body=b"")
            s3.put_object(Bucket="my-bucket", Key="x/ok", Body=b"yes")
            assert s3.get_object(Bucket="my-bucket", Key="x//double")["Body"].read() == b"no"
            """,
        ),
        stderr=True,
    )
    assert (home / "s3/my-bucket/x/ok").read_bytes() == b"yes"
    assert sorted(p.name for p in (home / "s3/my-bucket/x").iterdir()) == ["ok"]
    assert "2 objects not kept" in err and "s3://my-bucket/x//double" in err


def test_a_folder_that_is_no_bucket_is_named_and_the_rest_loaded(tmp_path):
    home = tmp_path / "home"
    (home / "s3/Not_A_Bucket!").mkdir(parents=True)
    (home / "s3/Not_A_Bucket!/k").write_bytes(b"x")
    (home / "s3/my-bucket/x").mkdir(parents=True)
    (home / "s3/my-bucket/x/k").write_bytes(b"kept")
    err = _done(
        _command(
            home, 'assert s3.get_object(Bucket="my-bucket", Key="x/k")["Body"].read() == b"kept"'
        ),
        stderr=True,
    )
    assert "Not_A_Bucket!" in err and "not a bucket name" in err
    assert (home / "s3/Not_A_Bucket!/k").exists()  # left as it was


def test_object_path_refuses_what_would_leave_the_store(tmp_path):
    from hetflow.infra.s3_store import object_path

    assert object_path(tmp_path, "b", "corpus/train/shard-00000.npy") == (
        tmp_path / "b/corpus/train/shard-00000.npy"
    )
    for key in ("../x", "a/../../x", "/abs", "a//b", "dir/", ".", "a/./b", ""):
        assert object_path(tmp_path, "b", key) is None, key
    assert object_path(tmp_path, "..", "x") is None


def test_throwaway_endpoints_keep_nothing(tmp_path, monkeypatch):
    """Benchmarks and the EC2 catalog (`keep=False`) leave no store behind."""
    from hetflow.infra.s3 import local_s3_endpoint

    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    import boto3

    with local_s3_endpoint(keep=False) as endpoint:
        s3 = boto3.client("s3", endpoint_url=endpoint)
        s3.create_bucket(Bucket="hetflow-bench-throwaway")
        s3.put_object(Bucket="hetflow-bench-throwaway", Key="k", Body=b"x")
    assert not (tmp_path / "hetflow-home" / "s3").exists()


def test_data_ls_refuses_an_unknown_protocol_in_one_line(tmp_path):
    proc = run_cli(["data", "ls", "ftp://host/data"], _env(tmp_path / "home"), timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hetflow: error: data ls: URL: ")
    assert "ftp://" in lines[0] and "s3://" in lines[0]


def test_data_ls_of_a_dead_configured_endpoint_says_so_in_one_line(tmp_path):
    env = {**_env(tmp_path / "home"), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    proc = run_cli(["data", "ls"], env, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "AWS_ENDPOINT_URL" in lines[0] and "127.0.0.1:9" in lines[0]


def test_the_s3_line_names_the_bucket_or_says_the_dataset_is_elsewhere(capsys):
    from hetflow.infra.s3 import local_s3_endpoint

    for url in ("file:///tmp/hetflow-elsewhere", "s3://their-bucket/x"):
        with local_s3_endpoint(url, keep=False):
            pass
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("bucket none: the dataset is at file:///tmp/hetflow-elsewhere")
    assert second.endswith("bucket their-bucket")
