"""All Consul I/O of the project's clients: :mod:`consul_io.client` (the one py-consul wrapper, its error type,
the token rule, timeouts) and :mod:`consul_io.layout` (every service, check and key name).

``devconsul/`` is the development Consul server and not a client; ``sim/`` registers services through
``sim/vllm/registration.py``. Nothing else imports ``consul`` (tests/unit/consul_io/test_layout.py checks it).
"""
