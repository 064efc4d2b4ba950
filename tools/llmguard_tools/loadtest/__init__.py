"""Load-test integrations: drive an OpenAI-compatible endpoint plain and through a Guard from a load tool.

``llmguard_tools.loadtest.locust`` holds Locust user classes (the ``llmguard-tools[locust]`` extra).
Nothing here is imported by the library itself, and importing this package imports no load tool: Locust
monkey-patches the standard library with gevent as soon as it is imported, so only a locustfile should.
"""
