"""Shared helpers for nodeagent's tests (no pytest plugins registered here)."""
