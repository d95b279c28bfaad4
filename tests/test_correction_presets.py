"""``correction.preset``: each of verl 0.9.1's named RolloutCorrectionConfig presets, expanded
into the correction vocabulary, maps back to exactly what verl's classmethod builds."""
from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from orchestrator.corrections import PRESETS, CorrectionSpec, parse_lo_hi
from orchestrator.verl import mapping

KEYS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
        "rollout_rs_threshold", "bypass_mode", "loss_type")


def _threshold(key: str, value: object, rs: str | None) -> object:
    """verl thresholds as numbers: '0.5_5.0' and '0.5_5' are one band."""
    if value is None:
        return None
    if key == "rollout_is_threshold":
        return parse_lo_hi(value) if isinstance(value, str) and "_" in value else float(value)
    opts = (rs or "").split(",")
    return tuple(parse_lo_hi(v) if o.endswith("_k1") else float(v)
                 for o, v in zip(opts, str(value).split(",")))


@pytest.mark.parametrize("name", list(PRESETS))
def test_preset_matches_verl_classmethod(name: str) -> None:
    pytest.importorskip("verl")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    theirs = dataclasses.asdict(getattr(RolloutCorrectionConfig, name)())
    spec = CorrectionSpec(preset=name).canonical()
    assert mapping.check_correction(spec) is None, name
    ours = mapping.correction_settings(spec)
    for key in KEYS:
        if key.endswith("threshold"):
            if key == "rollout_is_threshold" and theirs["rollout_is"] is None:
                continue  # unused without IS (verl keeps its 2.0 default)
            rs = theirs["rollout_rs"]
            assert _threshold(key, ours[key], rs) == _threshold(key, theirs[key], rs), (name, key)
        else:
            assert ours[key] == theirs[key], (name, key, ours[key], theirs[key])


def test_every_verl_preset_is_offered() -> None:
    pytest.importorskip("verl")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    verl_presets = {n for n, v in vars(RolloutCorrectionConfig).items() if isinstance(v, classmethod)}
    assert verl_presets - {"from_dict"} <= set(PRESETS) | {"model_validate"}, verl_presets - set(PRESETS)


def test_dataclass_default_trap() -> None:
    """verl's RolloutCorrectionConfig() has sequence IS on; 'disabled' here means no IS, as the
    classmethod and verl's YAML default do."""
    pytest.importorskip("verl")
    from verl.trainer.config.algorithm import RolloutCorrectionConfig

    assert RolloutCorrectionConfig().rollout_is == "sequence"
    assert mapping.correction_settings(CorrectionSpec(preset="disabled"))["rollout_is"] is None


def test_preset_hashes_like_its_fields() -> None:
    a = CorrectionSpec(preset="decoupled_seq_is_rs").canonical().non_default()
    b = CorrectionSpec(is_level="sequence", rs_filters={"seq_sum_k1": "0.5_2.0"}).canonical().non_default()
    assert a == b and "preset" not in a


def test_unknown_preset_did_you_mean() -> None:
    with pytest.raises(ValidationError, match="did you mean 'decoupled_geo_rs'"):
        CorrectionSpec(preset="decoupled_geo_r")


def test_field_beside_preset_must_agree() -> None:
    with pytest.raises(ValidationError, match="is_level: token conflicts with correction.preset"):
        CorrectionSpec(preset="decoupled_seq_is", is_level="token")
    # the defaults the grid loader fills in never conflict
    assert CorrectionSpec(preset="decoupled_seq_is", is_level="none").is_level == "sequence"
