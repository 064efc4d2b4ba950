"""HTTP plumbing under the layers: per-replica connection pools, TLS, proxies, Retry-After parsing, uploads sent
as they are read, compressed answers decoded, origins and the redirects that leave them."""
