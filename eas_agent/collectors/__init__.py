"""Collectors: each reads one subsystem and returns a small frozen reading; none talks to Consul."""
