"""The preflight profiles (preflight/profiles/): every profile loads with its cited floors, per-group profiles
and per-host overrides, clear errors, the depth sections."""

from __future__ import annotations

import pytest

from preflight.profiles import ProfileError, load_file, profile_for, run_depth

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "model, floors",
    [("h100-sxm", {4: 330, 8: 460}), ("h200-sxm", {4: 310, 8: 431}), ("a100-sxm", {4: 165, 8: 228})],
)
def test_every_profile_loads_with_its_cited_floors(model, floors):
    profile = profile_for("n1", {"gpu_model": model})
    assert profile["nccl"]["busbw_min_gbps"] == floors
    assert profile["ib"]["write_lat_max_us"] == 2.5 and profile["time_sync"]["max_offset_ms"] == 1.0


def test_profile_per_group_and_overrides_per_host():
    merged = profile_for(
        "n1",
        {
            "gpu_model": "h100-sxm",
            "preflight_profile": "h200-sxm",
            "preflight_overrides": {"nccl": {"busbw_min_gbps": {8: 400}}},
        },
    )
    assert merged["nccl"]["busbw_min_gbps"] == {8: 400} and merged["gpu"]["nvlink_min"] == 18
    assert profile_for("n1", {"gpu_model": "h100-sxm"})["nccl"]["busbw_min_gbps"][8] == 460  # cache untouched


def test_invalid_profiles_and_overrides_are_clear_errors(tmp_path):
    with pytest.raises(
        ProfileError, match=r"n1: preflight_overrides: ib.write_lat_max_us: expected a number > 0"
    ):
        profile_for(
            "n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"ib": {"write_lat_max_us": "fast"}}}
        )
    with pytest.raises(ProfileError, match="unknown section"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"nccll": {}}})
    with pytest.raises(ProfileError, match="no preflight profile 'b200-sxm'"):
        profile_for("n1", {"gpu_model": "b200-sxm"})
    bad = tmp_path / "bad.yml"
    bad.write_text(
        (load_file.__wrapped__.__globals__["PROFILE_DIR"] / "h100-sxm.yml")
        .read_text()
        .replace("write_bw_min_fraction: 0.90", "write_bw_min_fraction: 90")
    )
    with pytest.raises(
        ProfileError, match=r"ib.write_bw_min_fraction: expected a number in \(0, 1\], got 90"
    ):
        load_file(bad)


def test_every_profile_value_cites_a_source():
    from preflight.profiles import PROFILE_DIR

    for path in PROFILE_DIR.glob("*.yml"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if ":" in line and not line.strip().startswith("#") and not line.rstrip().endswith(":"):
                key = line.split(":")[0].strip()
                commented = "#" in line or lines[i - 1].strip().startswith("#")
                assert commented, f"{path.name}:{i + 1}: {key} has no source comment"


def test_the_depth_a_run_names_without_depth_is_the_profiles_default_when_they_agree():
    h100 = profile_for("n1", {"gpu_model": "h100-sxm"})
    quick = profile_for("n2", {"gpu_model": "h200-sxm", "preflight_overrides": {"depth": {"default": "quick"}}})
    assert run_depth({"n1": h100, "n2": profile_for("n2", {"gpu_model": "a100-sxm"})}) == "standard"
    assert run_depth({"n1": h100, "n2": quick}) is None  # mixed: the report says "per profile"
    assert run_depth({"n1": h100, "n2": quick}, "full") == "full"  # --depth names itself


def test_profiles_carry_depth_durations_and_reject_bad_depth_sections():
    profile = profile_for("n1", {"gpu_model": "h200-sxm"})
    assert profile["depth"]["default"] == "standard"
    assert {d: v["dcgm_level"] for d, v in profile["depth"]["levels"].items()} == {"quick": 1, "standard": 2, "full": 3}
    assert all(v["minutes"] > 0 for v in profile["depth"]["levels"].values())
    with pytest.raises(ProfileError, match=r"depth.default: expected one of quick, standard, full, got 'deep'"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"depth": {"default": "deep"}}})
    with pytest.raises(ProfileError, match=r"depth.levels: expected a mapping"):
        profile_for("n1", {"gpu_model": "h100-sxm",
                           "preflight_overrides": {"depth": {"levels": {"quick": {"dcgm_level": 9}}}}})
    with pytest.raises(ProfileError, match=r"throttle.fail_reasons: expected a list of clock event reasons"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"throttle": {"fail_reasons": ["hot"]}}})
    with pytest.raises(ProfileError, match=r"pcie.gpu_width: expected a PCIe link width"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"pcie": {"gpu_width": 12}}})


def test_known_wrong_values_are_not_in_the_profiles():
    """The issue's list: DCGM's H200 memory-bandwidth floor in the wrong unit (2333 in an MB/s field) is
    not copied (no memory-bandwidth floor of ours); the flap window is azurehpc's 6 h, not a guess."""
    def leaves(value, path=""):
        if isinstance(value, dict):
            for key, item in value.items():
                yield from leaves(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                yield from leaves(item, f"{path}[{index}]")
        else:
            yield path, value

    for model in ("h100-sxm", "h200-sxm", "a100-sxm"):
        profile = profile_for("n1", {"gpu_model": model})
        values = list(leaves(profile))
        assert [p for p, v in values if v in (2333, 2333.0, "2333")] == []  # at any depth of the profile
        assert [p for p, _ in values if "mem" in p.lower() and "bandwidth" in p.lower()] == []
        assert profile["ib_health"]["flap_window_hours"] == 6
        assert "hw_thermal_slowdown" in profile["throttle"]["fail_reasons"]
