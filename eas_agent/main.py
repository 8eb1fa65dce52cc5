"""``eas-agent`` entry point."""


def main() -> None:  # replaced by the agent issue's CLI
    raise SystemExit("eas-agent: not built yet")
