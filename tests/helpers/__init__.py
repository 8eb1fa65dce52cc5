"""Small helpers shared by test modules (and, beside this file, the helper modules of each subject)."""

from __future__ import annotations

import ast
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

from cli.main import main

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "fixtures" / "golden" / "provision"  # what the roles render, byte for byte


def role_tasks(role: str, file: str) -> list[dict]:
    """A role's task file as Ansible runs it: each ``import_tasks`` of a sibling file replaced by its tasks."""
    import yaml

    tasks = []
    for task in yaml.safe_load((REPO / "roles" / role / "tasks" / file).read_text()):
        imported = task.get("ansible.builtin.import_tasks")
        tasks += role_tasks(role, imported) if imported else [task]
    return tasks


def render_role_text(text: str, variables: dict):
    """``text`` templated as Ansible templates a task argument, with the playbooks' filters: a role's expression
    checked in-process, without a play."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import filter_loader
    from ansible.template import Templar, trust_as_template

    filter_loader.add_directory(str(REPO / "playbooks/filter_plugins"))
    return Templar(loader=DataLoader(), variables=variables).template(trust_as_template(text))


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``clusterctl ARGS`` in-process; return (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under root (text is dedented) and return root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    """``condition()``'s first truthy value within ``timeout`` seconds, else AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def module_imports(tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """(module, line, inside a function) of every absolute import in ``tree``, at any depth (the import
    lints: tests/guards/test_import_lint.py, tests/guards/test_ansible_imports.py)."""

    def visit(node: ast.AST, in_function: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                yield from ((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module, child.lineno, in_function
            yield from visit(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))

    return visit(tree, False)


def python_packages(repo: Path) -> set[str]:
    """The repository's top-level folders that hold Python code (the import lints say where each one stands)."""
    return {d.name for d in repo.iterdir() if d.is_dir() and not d.name.startswith(".") and any(d.rglob("*.py"))}


class ConsulCluster:
    """A dev Consul server and one client agent per node, as on real nodes: what a node registers through its
    own agent lands on its own catalog node, which is the only ownership the edge's reader accepts. Agents
    sync their changes to the server at once (status and output alike)."""

    def __init__(self):
        import socket

        from devconsul.agentconfig import AgentSettings
        from devconsul.server import DevConsulServer

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.rpc_port = sock.getsockname()[1]
        self._settings, self._server_class = AgentSettings, DevConsulServer
        self.server = DevConsulServer(addr="127.0.0.1:0", failure_timeout=5.0, agent=AgentSettings(
            "consul-server", server=True, server_port=self.rpc_port, check_update_interval=0)).start()
        self.address = self.server.address
        self.agents: dict[str, object] = {}

    def agent(self, node: str) -> str:
        """The HTTP address of ``node``'s client agent (started on first use)."""
        if node not in self.agents:
            settings = self._settings(node, server=False, retry_join=[f"127.0.0.1:{self.rpc_port}"],
                                      leave_on_terminate=True, check_update_interval=0)
            self.agents[node] = self._server_class(addr="127.0.0.1:0", agent=settings).start()
        return self.agents[node].address

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop(leave=False)
        self.server.stop()

    def __enter__(self) -> ConsulCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
