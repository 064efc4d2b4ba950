"""Cache-aware routing: affinity keys, their hashing, and the placement of a key on a replica."""
