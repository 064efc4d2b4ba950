"""The layers of the pipeline before the first token: bulkhead, deadline, retry, hedge, attempt."""
