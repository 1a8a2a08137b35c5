"""Streaming data: the shard format and manifest (`format`), ingest from the user's files
(`ingest`), the shard cache (`cache`), the partition of samples over ranks (`partition`),
decoding shards (`shards`) and each rank's reader (`reader`)."""
