"""llmguard-tools: the simulated cluster, the load-test harness and the rollout comparison for llmguard_client.

sim       a simulated cluster of OpenAI-compatible replicas (``python -m llmguard_tools.sim``)
bench     ``llmguard bench`` / ``llmguard demo``: the same seeded traffic through several clients
compare   ``llmguard compare``: a rollout's guarded cohort against its control cohort
loadtest  Locust user classes, plain and guarded
cli       the ``llmguard`` command

The tools use only the public API of ``llmguard_client`` (its ``__all__`` and its public modules); the runtime
never imports them.
"""
