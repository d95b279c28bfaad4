"""Kubernetes name and label rules: clear one-line errors, deterministic safe names."""

from __future__ import annotations

import pytest

from orchestrator.exceptions import UserError
from orchestrator.k8s import names


@pytest.mark.parametrize("value", ["a", "abc-123", "x" * 63, "0abc"])
def test_dns_label_accepts(value: str) -> None:
    assert names.check_dns_label(value, "name") == value


@pytest.mark.parametrize(
    "value,needle",
    [
        ("", "non-empty"),
        ("x" * 64, "at most 63"),
        ("Abc", "lowercase"),
        ("a_b", "lowercase"),
        ("-a", "start with"),
        ("a-", "end with"),
        ("a.b", "lowercase"),
        ("a b", "lowercase"),
        ("a;rm -rf /", "lowercase"),
        ("a\nb", "lowercase"),
    ],
)
def test_dns_label_rejects_with_one_line(value: str, needle: str) -> None:
    with pytest.raises(UserError) as exc:
        names.check_dns_label(value, "pool name")
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg and "pool name" in msg and "fix:" in msg


def test_dns1035_needs_a_letter_first() -> None:
    with pytest.raises(UserError, match="DNS-1035"):
        names.check_dns_label("1abc", "RayJob name", dns1035=True)


@pytest.mark.parametrize(
    "value,ok",
    [
        ("", True),
        ("NVIDIA-H100-80GB-HBM3", True),
        ("a.b_c-d", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("-a", False),
        ("a-", False),
        ("a b", False),
        ("a/b", False),
        ("$(touch x)", False),
    ],
)
def test_label_values(value: str, ok: bool) -> None:
    if ok:
        assert names.check_label_value(value, "label") == value
    else:
        with pytest.raises(UserError, match="label value"):
            names.check_label_value(value, "label")


@pytest.mark.parametrize(
    "key,ok",
    [
        ("nvidia.com/gpu.product", True),
        ("app", True),
        ("kueue.x-k8s.io/queue-name", True),
        ("Bad_Prefix/x", False),
        ("/x", False),
        ("a/" + "x" * 64, False),
        ("a/b/c", False),
    ],
)
def test_label_keys(key: str, ok: bool) -> None:
    if ok:
        names.check_label_key(key, "k")
    else:
        with pytest.raises(UserError, match="label key"):
            names.check_label_key(key, "k")


def test_rayjob_name_is_deterministic_and_within_kuberay_limit() -> None:
    a = names.rayjob_name("seed-study-4b", "t0653151e5509", 1)
    assert a == "ab-seed-study-4b-t0653151e5509-a1"
    assert a == names.rayjob_name("seed-study-4b", "t0653151e5509", 1)
    long1 = names.rayjob_name("a" * 40 + "-one", "t0653151e5509", 12)
    long2 = names.rayjob_name("a" * 40 + "-two", "t0653151e5509", 12)
    for n in (long1, long2):
        assert len(n) <= 47 and names.DNS1035_LABEL.match(n)
        assert n.endswith("-t0653151e5509-a12")
    assert long1 != long2  # the shortened grid part keeps a digest of the full name


def test_rayjob_name_rejects_bad_attempt() -> None:
    with pytest.raises(UserError, match="attempt"):
        names.rayjob_name("g", "t1", 0)


def test_label_safe_keeps_valid_and_digests_the_rest() -> None:
    assert names.label_safe("seed-study-4b") == "seed-study-4b"
    long = names.label_safe("x" * 80)
    assert len(long) <= 63 and names.LABEL_VALUE.match(long)
    assert long != names.label_safe("x" * 81)
