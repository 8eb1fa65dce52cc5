"""Renderings shared by a command and the demo (``demo/``, above the CLI): the one part of ``cli`` the demo
imports (tests/test_import_lint.py)."""
