"""Provisioning: plan a playbook run, drive ansible-runner, follow the rollout.

- :mod:`provision.plan`: batches (Ansible's ``serial`` rules), roles and tags, the validated plan;
- :mod:`provision.rollout`: per-host progress, the recap, reboot and diff bookkeeping, from events;
- :mod:`provision.run`: the ansible-runner driver and the run directory (``events.jsonl``).

``clusterctl provision`` (:mod:`cli.commands.provision`) is glue over these: options in, views out.
"""
