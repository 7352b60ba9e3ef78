"""Where the write stage publishes a partition."""
