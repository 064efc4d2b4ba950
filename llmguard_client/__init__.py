"""llmguard_client: client-side resilience for OpenAI-compatible LLM endpoints."""
