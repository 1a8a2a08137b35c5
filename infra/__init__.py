"""Everything that talks to the outside world: S3, EC2, the local machine, the shard cache."""
