"""State shared across calls, owned by the Guard: replicas, routing, health, TTFT statistics, budget."""
