"""Which replica gets an attempt, and when none should: replicas, router, health, cool-downs, TTFT, affinity."""
