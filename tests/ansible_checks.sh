#!/usr/bin/env bash
# Ansible checks run by `make test`: syntax-check of every playbook, then ansible-lint (production profile).
set -euo pipefail
cd "$(dirname "$0")/.."
export ANSIBLE_CONFIG="$PWD/ansible.cfg"
shopt -s nullglob
playbooks=(playbooks/*.yml)
if [ ${#playbooks[@]} -eq 0 ]; then
  echo "ansible-checks: no playbooks yet"
  exit 0
fi
for pb in "${playbooks[@]}"; do
  ansible-playbook --syntax-check -i inventory/virtual "$pb" >/dev/null
done
echo "syntax-check: ${#playbooks[@]} playbooks OK"
ansible-lint --offline --profile production -q .
