"""HTTP plumbing under the layers: per-replica connection pools, TLS, Retry-After parsing."""
