"""snapops.daemon: WAL, client, spool, pipeline stages, ledger, git, push queue, service."""
