"""The retry budget shared by retries and hedges, and its fleet-wide sync."""
