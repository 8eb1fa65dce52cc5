"""``clusterctl demo``: the whole toolkit end to end on a temporary virtual cluster (:mod:`demo.scenario`), with
a routed traffic mix (:mod:`demo.traffic`).

An application above the CLI, like ``bench/``: it drives the simulators (``sim``) and draws with the CLI's
views; ``cli/commands/demo.py`` imports it only when the command runs (tests/test_import_lint.py).
"""
