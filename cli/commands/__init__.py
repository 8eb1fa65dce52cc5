"""One module per ``clusterctl`` command, each exposing a click command named ``command``.

:data:`cli.main.COMMANDS` names them; a module is imported only when its command runs.
"""
