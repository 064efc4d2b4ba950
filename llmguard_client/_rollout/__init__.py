"""Gradual rollout: the cohort of each call, and the control cohort's pass-through path."""
