"""One call's life: the transport, the call, its lease, the pipeline, how a failure reaches the caller, time."""
