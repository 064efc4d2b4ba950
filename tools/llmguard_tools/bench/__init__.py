"""``llmguard bench``: replay the same seeded traffic through several clients and compare them."""
