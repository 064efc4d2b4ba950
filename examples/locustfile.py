"""Plain and guarded users side by side in one Locust run (``pip install -e . -e './tools[locust]'`` in a checkout).

Start the simulated cluster (its replica URLs are printed, and written to the ready file)::

    python -m llmguard_tools.sim --scenario stragglers --ready-file /tmp/sim.json &
    URLS=$(python -c "import json; print(','.join(json.load(open('/tmp/sim.json'))['urls']))")

One machine::

    locust -f examples/locustfile.py --headless -u 20 -r 20 -t 30s --llm-replicas "$URLS"

A master and any number of workers (on other machines: ``--master-host`` is the master's address)::

    locust -f examples/locustfile.py --master --headless --expect-workers 2 -u 20 -r 20 -t 30s --llm-replicas "$URLS"
    locust -f examples/locustfile.py --worker --master-host 127.0.0.1      # once per worker

Locust's table then has one ``TTFT`` row (time to the first content token) and one ``total`` row per
user class: ``plain`` calls the replicas round-robin, ``guarded`` goes through one Guard per Locust process.
"""

from __future__ import annotations

import logging

from locust import constant

from llmguard_tools.loadtest.locust import GuardedChatUser, PlainChatUser

# httpx2 logs one INFO line per request, and Locust workers forward their log lines to the master.
logging.getLogger("httpx2").setLevel(logging.WARNING)


class Plain(PlainChatUser):
    """Straight to the replicas with the openai SDK."""

    wait_time = constant(0.05)
    max_tokens = 8  # short answers: the comparison is about the first token


class Guarded(GuardedChatUser):
    """The same calls through a Guard (default policies: hedging on the first token, retries, deadlines)."""

    wait_time = constant(0.05)
    max_tokens = 8
