"""Git LFS: pointer files, a small batch-API client, and the object cache that restores shards."""
