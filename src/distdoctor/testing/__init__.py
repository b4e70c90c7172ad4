"""Helpers for testing distributed jobs for real on one machine (virtual hosts, process cleanup)."""
