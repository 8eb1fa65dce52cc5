"""Agent config: the documented example loads; each bad field is named in the error."""

from __future__ import annotations

import textwrap

import pytest

from eas_agent.config import ConfigError, load_config

pytestmark = pytest.mark.unit

GOOD = """
node: r01n01
rack: r01
datacenter: dc1
interval_s: 0.2
heartbeat_s: 2.0
profile: drain
listen: 127.0.0.1:9105
consul:
  address: 127.0.0.1:8500
  scheme: http
  token_file: /etc/eas-agent/consul.token
  ca_file: null
  kv_prefix: clusterctl/eas
gpu_backend: nvml
sysfs_root: /sys
ius:
  - id: r01n01-iu0
    gpus: [0, 1, 2, 3]
    numa_node: 0
    metrics_url: http://127.0.0.1:8000/metrics
    rdma_devices: [mlx5_0, mlx5_1]
    netdevs: [ibp24s0, ibp41s0]
"""


def write(tmp_path, text):
    path = tmp_path / "config.yml"
    path.write_text(textwrap.dedent(text))
    return path


def test_documented_example_loads(tmp_path):
    config = load_config(write(tmp_path, GOOD))
    assert config.node == "r01n01" and config.ius[0].gpus == (0, 1, 2, 3)
    assert config.kv_key == "clusterctl/eas/dc1/r01n01"
    assert config.consul.token_file == "/etc/eas-agent/consul.token"


def test_no_token_file_is_no_token(tmp_path):
    config = load_config(write(tmp_path, GOOD.replace("  token_file: /etc/eas-agent/consul.token\n", "")))
    assert config.consul.token_file is None and config.consul.read_token() is None


def test_a_configured_token_file_that_is_missing_stops_the_agent(tmp_path):
    """It used to mean "no token" with a warning: against a Consul with ACLs on, 403 on every write later.
    Now the one token rule's error, naming the config, the field and the file (a ConfigError: exit 2)."""
    from eas_agent.agent import open_store

    missing = tmp_path / "consul.token"
    path = write(tmp_path, GOOD.replace("/etc/eas-agent/consul.token", str(missing)))
    with pytest.raises(ConfigError) as info:
        open_store(load_config(path), timeout_s=1.0)
    assert info.value.field == "consul.token_file"
    assert str(info.value) == (f"{path}: consul.token_file: {missing}: cannot read the Consul token file: "
                               "No such file or directory")


def test_an_https_address_with_the_scheme_left_at_http_stops_the_agent(tmp_path):
    """It was read as plain http (the token in cleartext); now the config is named, field and both schemes."""
    from eas_agent.agent import open_store

    path = write(tmp_path, GOOD.replace("address: 127.0.0.1:8500", "address: https://127.0.0.1:8501").replace(
        "  token_file: /etc/eas-agent/consul.token\n", ""))
    with pytest.raises(ConfigError) as info:
        open_store(load_config(path), timeout_s=1.0)
    assert info.value.field == "consul.address" and "says https but the scheme given is http" in str(info.value)
    https = load_config(write(tmp_path, path.read_text().replace("scheme: http", "scheme: https")))
    assert open_store(https, timeout_s=1.0).client.http.base_uri == "https://127.0.0.1:8501"


def test_write_budget_settings_default_and_reach_the_publisher(tmp_path):
    from eas_agent.agent import Agent
    from sim.memstore import MemoryStore

    config = load_config(write(tmp_path, GOOD))
    assert (config.write_rate_per_s, config.write_burst, config.urgent_rise_s) == (0.95, 2.0, None)
    tuned = load_config(write(tmp_path, GOOD + "write_rate_per_s: 0.5\nwrite_burst: 3\nurgent_rise_s: 1.5\n"))
    store = MemoryStore()
    for cfg, rise in ((config, 0.5), (tuned, 1.5)):  # None: the drain profile's 0.5 s
        publisher = Agent(cfg, store=store, stop_store=store, serve_http=False, gpu_backend=object()).publisher
        assert publisher.urgent_rise_s == rise
    assert (publisher.write_rate_per_s, publisher.write_burst) == (0.5, 3.0)


def test_an_ius_capacity_priors_default_to_the_scorers_and_reach_its_scorer(tmp_path):
    from eas_agent.agent import IUPipeline
    from eas_agent.score import DrainParams

    config = load_config(write(tmp_path, GOOD))
    iu = config.ius[0]
    assert (iu.prefill_tps_prior, iu.decode_tps_prior) == (DrainParams.prefill_tps_prior, DrainParams.decode_tps_prior)
    tuned = load_config(write(tmp_path, GOOD + "    prefill_tps_prior: 160000\n    decode_tps_prior: 40000\n"))
    scorer = IUPipeline(tuned, 0, vllm=object()).scorer
    assert (scorer.prefill.value, scorer.decode.value) == (160000.0, 40000.0)


def test_token_read_from_file(tmp_path):
    token = tmp_path / "consul.token"
    token.write_text("s3cr3t\n")
    token.chmod(0o600)
    config = load_config(write(tmp_path, GOOD.replace("/etc/eas-agent/consul.token", str(token))))
    assert config.consul.read_token() == "s3cr3t"


@pytest.mark.parametrize(
    "old, new, field, words",
    [
        ("profile: drain", "profile: fastest", "profile", "must be one of drain, seed"),
        ("interval_s: 0.2", "interval_s: -1", "interval_s", "must be > 0"),
        ("interval_s: 0.2", "interval_s: fast", "interval_s", "expected a number"),
        ("heartbeat_s: 2.0", "heartbeat_s: 0.1", "heartbeat_s", ">= interval_s"),
        ("gpus: [0, 1, 2, 3]", "gpus: [0, x]", "ius[0].gpus[1]", "GPU index"),
        ("gpus: [0, 1, 2, 3]", "gpus: []", "ius[0].gpus", "at least one GPU"),
        (
            "metrics_url: http://127.0.0.1:8000/metrics",
            "metrics_url: 127.0.0.1:8000",
            "ius[0].metrics_url",
            "expected http",
        ),
        ("id: r01n01-iu0", "id: r02n01-iu0", "ius[0].id", "<node>-iu<N>"),
        ("address: 127.0.0.1:8500", "address: consul", "consul.address", "HOST:PORT"),
        # a config still written for the removed file-reading backend is refused at start, naming the field
        ("gpu_backend: nvml", "gpu_backend: fake", "gpu_backend", "must be one of nvml; got 'fake'"),
        ("sysfs_root: /sys", "sysfs_root: /sys\nfake_gpu_file: /run/x.json", "fake_gpu_file", "unknown field"),
        ("sysfs_root: /sys", "sysfs_root: /sys\nintervall_s: 1", "intervall_s", "unknown field"),
        ("listen: 127.0.0.1:9105", "listen: localhost:9105", "listen", "IP address"),
        ("node: r01n01\n", "", "node", "required field is missing"),
        ("sysfs_root: /sys", "sysfs_root: /sys\nwrite_burst: 0.5", "write_burst", "must be >= 1"),
        ("sysfs_root: /sys", "sysfs_root: /sys\nwrite_rate_per_s: 0", "write_rate_per_s", "must be > 0"),
        ("sysfs_root: /sys", "sysfs_root: /sys\nurgent_rise_s: -1", "urgent_rise_s", "must be > 0"),
        ("numa_node: 0", "numa_node: 0\n    prefill_tps_prior: 0", "ius[0].prefill_tps_prior", "must be > 0"),
        ("numa_node: 0", "numa_node: 0\n    decode_tps_prior: .inf", "ius[0].decode_tps_prior", "finite number"),
    ],
)
def test_bad_field_is_named(tmp_path, old, new, field, words):
    path = write(tmp_path, GOOD.replace(old, new, 1))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.field == field, str(info.value)
    assert str(path) in str(info.value) and words in str(info.value)


def test_invalid_yaml_names_the_line(tmp_path):
    with pytest.raises(ConfigError, match=r"line 4: not valid YAML"):
        load_config(write(tmp_path, "node: a\nrack: b\nius: [\n  - {id: x\n"))


def test_cli_bad_config_exit_2(tmp_path, capsys):
    from eas_agent.main import main

    path = write(tmp_path, GOOD.replace("profile: drain", "profile: fastest"))
    with pytest.raises(SystemExit) as info:
        main(["run", "--config", str(path)])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "profile: must be one of" in err and str(path) in err


def test_token_file_readable_by_others_is_refused(tmp_path):
    token = tmp_path / "consul.token"
    token.write_text("s3cr3t\n")
    token.chmod(0o644)
    config = load_config(write(tmp_path, GOOD.replace("/etc/eas-agent/consul.token", str(token))))
    with pytest.raises(ConfigError, match="chmod 600") as info:
        config.consul.read_token()
    assert "s3cr3t" not in str(info.value)
