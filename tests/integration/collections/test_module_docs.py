"""The collection's modules: ansible-doc reads every module's documentation (doc fragments merged in), and
what each documents is what its argument spec takes (names, types, defaults, required), as ansible-test's
validate-modules checks (it needs the network here to bootstrap its own environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
COLLECTIONS = REPO / "collections"
MODULES = sorted(p.stem for p in (COLLECTIONS / "ansible_collections/clusterctl/infra/plugins/modules").glob("*.py"))

# Runs each module's main() with AnsibleModule.__init__ replaced by one that reports its argument spec and
# stops: the spec is whatever main() builds, shared pieces included.
_SPEC_PROBE = r"""
import importlib, json, sys
from ansible.module_utils import basic

class Captured(Exception):
    pass

def capture(self, argument_spec, **kwargs):
    raise Captured(argument_spec)

basic.AnsibleModule.__init__ = capture
specs = {}
for name in sys.argv[1:]:
    module = importlib.import_module(f"ansible_collections.clusterctl.infra.plugins.modules.{name}")
    try:
        module.main()
    except Captured as exc:
        specs[name] = exc.args[0]
print(json.dumps(specs))
"""


def _env() -> dict:
    return dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(COLLECTIONS), PYTHONPATH=str(COLLECTIONS),
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture(scope="module")
def docs() -> dict:
    run = subprocess.run(["ansible-doc", "--json", *(f"clusterctl.infra.{m}" for m in MODULES)], cwd=REPO,
                         env=_env(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and not run.stderr.strip(), run.stderr[-3000:]
    return {name.removeprefix("clusterctl.infra."): entry["doc"] for name, entry in json.loads(run.stdout).items()}


@pytest.fixture(scope="module")
def specs() -> dict:
    run = subprocess.run([sys.executable, "-c", _SPEC_PROBE, *MODULES], cwd=REPO, env=_env(), capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def test_every_module_s_documentation_parses(docs):
    assert sorted(docs) == MODULES
    for name, doc in docs.items():
        assert doc.get("short_description") and doc.get("description"), name


@pytest.mark.parametrize("name", MODULES)
def test_documented_options_are_the_argument_spec(name, docs, specs):
    documented = {option: (doc.get("type", "str"), doc.get("default"), bool(doc.get("required")))
                  for option, doc in docs[name].get("options", {}).items()}
    declared = {option: (spec.get("type", "str"), spec.get("default"), bool(spec.get("required")))
                for option, spec in specs[name].items()}
    assert documented == declared
