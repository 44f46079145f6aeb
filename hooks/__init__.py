"""snapops.hooks: verification used by git hooks and CI, hook installer, review diffs."""
