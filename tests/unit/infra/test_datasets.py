"""Datasets in S3 (moto over HTTP): ingest, bad input, killed ingests, reading a rank's share."""

from __future__ import annotations

import os

import pytest
from prefect.states import Completed, Failed

from hetflow.infra.data.format import (
    ChecksumError,
    DatasetError,
    read_manifest,
    verify_dataset,
)
from hetflow.tasks.data import _retry_unless_bad_data, ingest_dataset

from tests.helpers.infra.datasets import _spec


@pytest.mark.parametrize("source", ["synthetic", "digits"])
def test_the_built_in_sources_write_to_a_local_folder_that_does_not_exist(tmp_path, source):
    url = (tmp_path / "not-yet" / "mydata").as_uri()
    manifest = ingest_dataset.fn(_spec(tmp_path, url=url, source=source))
    assert (tmp_path / "not-yet/mydata/train/shard-00000.npz").is_file()
    verify_dataset(manifest, deep=True)
    assert read_manifest(url) == manifest


def test_failed_writes_are_not_retried_when_the_data_is_bad():
    assert _retry_unless_bad_data(None, None, Failed(data=DatasetError("s3://b/x: bad"))) is False
    assert _retry_unless_bad_data(None, None, Failed(data=ChecksumError("s3://b/x: bad"))) is False
    assert _retry_unless_bad_data(None, None, Failed(data=ConnectionError("reset"))) is True
    assert _retry_unless_bad_data(None, None, Completed()) is True


def test_aws_credentials_alone_keep_a_run_on_the_local_endpoint(monkeypatch):
    """A user with AWS credentials in the environment who names no dataset URL of their own
    gets the local endpoint (the default bucket name is global on AWS); naming their own
    bucket sends the run to AWS; `AWS_ENDPOINT_URL` wins over both."""
    from hetflow.infra.s3 import DEFAULT_DATASET_URL, local_s3_endpoint

    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALLOOKINGKEY01")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real-looking-secret")
    # any URL in the default bucket, the profile history's (`recommend --profiles`) too
    for url in (None, DEFAULT_DATASET_URL, "s3://hetflow-data/profiles/types"):
        with local_s3_endpoint(url) as endpoint:
            assert endpoint.startswith("http://127.0.0.1:")
            assert os.environ["AWS_ENDPOINT_URL"] == endpoint
            assert os.environ["AWS_ACCESS_KEY_ID"] != "AKIAREALLOOKINGKEY01"  # the local ones
        assert "AWS_ENDPOINT_URL" not in os.environ
        assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIAREALLOOKINGKEY01"  # put back
    with local_s3_endpoint("s3://my-own-bucket/data") as endpoint:
        assert endpoint == "aws"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with local_s3_endpoint("s3://my-own-bucket/data") as endpoint:
        assert endpoint == "http://127.0.0.1:9"


def test_without_credentials_a_named_bucket_is_served_locally(monkeypatch):
    from hetflow.infra.s3 import local_s3_endpoint

    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    with local_s3_endpoint("s3://my-own-bucket/data") as endpoint:
        assert endpoint.startswith("http://127.0.0.1:")
