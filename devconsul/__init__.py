"""devconsul: a development server that follows Consul's HTTP API for the endpoints this project uses.

It is NOT Consul: one node, one datacenter, no Raft, gossip, DNS, sessions or Connect. Tests, CI and the
demo use it through the real py-consul client; production uses a real Consul agent. See README.md here.
"""
