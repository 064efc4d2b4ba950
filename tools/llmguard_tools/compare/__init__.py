"""``llmguard compare``: the guarded cohort of a rollout against its control cohort.

load     RecordLogger JSON lines -> `Call` views
stats    bootstrap intervals drawn from the exact resampling distributions (pure Python)
summary  per cohort and tier figures, guarded - control differences
verdict  widen / hold / roll back against `Thresholds`
render   text and JSON
command  the CLI subcommand
"""
