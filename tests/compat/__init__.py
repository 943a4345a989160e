"""Compatibility probes and their environments, run by the integration tests."""
