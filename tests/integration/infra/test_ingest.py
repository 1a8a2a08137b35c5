"""Ingest of the user's data as they have it: text, Parquet and image folders, local or in S3
(moto over HTTP), streamed into shards + manifest with bounded memory; bad sources refused."""

from __future__ import annotations

import pytest

from hetflow.config import DatasetSpec
from hetflow.infra.data.format import DatasetError, check_shards, read_manifest
from hetflow.infra.s3 import filesystem

from tests.helpers.infra.ingest import _ingest


def test_text_in_s3_is_ingested_from_its_prefix(s3, tmp_path):
    fs, _ = filesystem("s3://corpus/in")
    fs.mkdir("corpus")
    fs.pipe_file("corpus/in/a.txt", b"hello world " * 200)
    fs.pipe_file("corpus/in/b.txt", b"second file " * 200)
    m = _ingest(source="text", source_url="s3://corpus/in", glob="*.txt", url="s3://corpus/ds")
    assert m.kind == "tokens" and sum(s.samples for s in m.splits.values()) == 4800
    check_shards(read_manifest("s3://corpus/ds"))


def test_an_existing_dataset_that_is_not_there_says_how_to_write_it(s3):
    from hetflow.tasks.data import ingest_dataset

    with pytest.raises(DatasetError, match=r"hetflow data ingest --to s3://nobody-wrote/this"):
        ingest_dataset.fn(DatasetSpec(source="existing", url="s3://nobody-wrote/this"))
