"""Renderings shared by a command and the simulators' demo (which must not import command modules)."""
