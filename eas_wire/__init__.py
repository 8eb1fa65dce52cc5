"""The protocol between the EAS agent (``eas_agent``) and the edge (``edge``): what crosses between the two
deployables, and nothing else. Both import it; it imports nothing of this project (standard library only,
PyYAML for the config field reader, cryptography for the signatures), so either side installs it without
the other.

- :mod:`eas_wire.scorebody`: the score body an agent writes to Consul's KV and serves on ``GET /scores``,
  with the score terms readers act on (docs/contracts/score-body.md);
- :mod:`eas_wire.stream`: ``GET /scores?stream=1`` and the blocking query, their framing and constants
  (docs/contracts/scores-stream.md);
- :mod:`eas_wire.announce`: ``POST /announce``, the batch an edge sends and the answer it gets
  (docs/contracts/announce.md);
- :mod:`eas_wire.signing`: the edges' Ed25519 signatures on announce batches and stream requests (the
  agents hold only public keys);
- :mod:`eas_wire.fields`: the YAML field reader both config files use, so both read and fail alike;
- :mod:`eas_wire.private_file`: the one rule both sides read a secret's file by (owner-only, mode 0600);
- :mod:`eas_wire.fetch`: one HTTP GET within a deadline (the agent's vLLM scrape, a reader's ``/scores`` poll).
"""
