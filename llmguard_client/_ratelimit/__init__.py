"""Provider rate limits: the layer, the token buckets, x-ratelimit-* headers, prompt estimates, the fleet script."""
