"""Integrations with the tools a team runs around beat (each imported only when its library is)."""
