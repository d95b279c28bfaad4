"""Kubernetes naming rules, checked before anything is sent, and safe names for trial objects.

Rules (Kubernetes ``apimachinery/pkg/util/validation``): an object name that becomes a DNS label
is DNS-1123 (``[a-z0-9]([-a-z0-9]*[a-z0-9])?``, at most 63 characters); KubeRay additionally
requires RayJob names to be DNS-1035 labels (start with a letter) of at most 47 characters,
because it appends a 6-character suffix for the RayCluster (``MaxRayJobNameLength`` in KubeRay
v1.7.0 ``ray-operator/controllers/ray/utils/constant.go``). A label value is at most 63
characters of ``[A-Za-z0-9._-]`` that starts and ends alphanumeric. Every failure is a one-line
``UserError`` naming the value, the rule it breaks and the fix.
"""

from __future__ import annotations

import hashlib
import re

from orchestrator.exceptions import UserError

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

MAX_LABEL = 63
MAX_SUBDOMAIN = 253
MAX_RAYJOB_NAME = 47  # KubeRay: MaxRayClusterNameLength (53) - 6


def _fail(what: str, value: str, rule: str, fix: str) -> UserError:
    return UserError(f"{what} {value!r} is not a valid Kubernetes {rule}; fix: {fix}")


def check_dns_label(
    value: str, what: str, *, max_len: int = MAX_LABEL, dns1035: bool = False
) -> str:
    """Return ``value`` if it is a DNS-1123 (or DNS-1035) label of at most ``max_len`` chars."""
    rule = "DNS-1035 label" if dns1035 else "DNS-1123 label"
    if not isinstance(value, str) or not value:
        raise _fail(what, str(value), rule, "give a non-empty name")
    if len(value) > max_len:
        raise _fail(what, value, rule, f"use at most {max_len} characters (got {len(value)})")
    pattern = DNS1035_LABEL if dns1035 else DNS1123_LABEL
    if not pattern.match(value):
        start = "a lowercase letter" if dns1035 else "a lowercase letter or digit"
        raise _fail(
            what,
            value,
            rule,
            f"use lowercase letters, digits and '-', start with {start} "
            "and end with a letter or digit",
        )
    return value


def check_subdomain(value: str, what: str) -> str:
    """Return ``value`` if it is a DNS-1123 subdomain (names of most objects, e.g. flavors)."""
    if not value or len(value) > MAX_SUBDOMAIN or not DNS1123_SUBDOMAIN.match(value):
        raise _fail(
            what,
            value,
            "DNS-1123 subdomain",
            "use at most 253 lowercase letters, digits, '-' and '.', alphanumeric at both ends",
        )
    return value


def check_label_value(value: str, what: str) -> str:
    """Return ``value`` if it is a valid label value (may be empty)."""
    if not isinstance(value, str) or len(value) > MAX_LABEL or not LABEL_VALUE.match(value):
        raise _fail(
            what,
            str(value),
            "label value",
            "use at most 63 characters of letters, digits, '-', '_' and '.', "
            "alphanumeric at both ends",
        )
    return value


def check_label_key(key: str, what: str) -> str:
    """Return ``key`` if it is a valid label key: optional DNS subdomain prefix + '/' + name."""
    prefix, sep, name = key.rpartition("/")
    if sep and (not prefix or not DNS1123_SUBDOMAIN.match(prefix) or len(prefix) > MAX_SUBDOMAIN):
        raise _fail(what, key, "label key", "the prefix before '/' must be a DNS-1123 subdomain")
    if not name or len(name) > MAX_LABEL or not LABEL_NAME.match(name):
        raise _fail(
            what,
            key,
            "label key",
            "the name after the prefix is at most 63 letters, digits, '-', '_' and '.'",
        )
    return key


def check_labels(labels: dict[str, str], what: str) -> dict[str, str]:
    """Check every key and value of a label map (node labels, object labels)."""
    for k, v in labels.items():
        check_label_key(k, f"{what} key")
        check_label_value(v, f"{what}[{k}]")
    return labels


def check_env_name(name: str) -> str:
    if not ENV_NAME.match(name):
        raise UserError(
            f"environment variable name {name!r} is not valid for Kubernetes; "
            "fix: use letters, digits, '_', '-' and '.', not starting with a digit"
        )
    return name


def slug(text: str, max_len: int) -> str:
    """Lowercase ``text`` into ``[a-z0-9-]``, squeeze dashes, trim to ``max_len``."""
    out = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return out[:max_len].rstrip("-")


def _digest(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def rayjob_name(grid: str, trial_id: str, attempt: int) -> str:
    """Deterministic RayJob name for one attempt: ``ab-<grid>-<trial>-a<attempt>``.

    The grid part is shortened (with a digest suffix, so two long grid names never collide) to
    keep the name within KubeRay's 47 characters; the trial id is kept whole since it is the key.
    """
    if attempt < 1:
        raise UserError(f"attempt {attempt} is not valid; fix: attempts are numbered from 1")
    tid = slug(trial_id, 20) or _digest(trial_id, 12)
    tail = f"-{tid}-a{attempt}"
    room = MAX_RAYJOB_NAME - len("ab-") - len(tail)
    g = slug(grid, room)
    if g != slug(grid, 10_000):  # shortened: make the cut unique
        g = slug(grid, max(room - 7, 1)) + "-" + _digest(grid, 6)
    name = f"ab-{g}{tail}" if g else f"ab{tail}"
    return check_dns_label(name, "RayJob name", max_len=MAX_RAYJOB_NAME, dns1035=True)


def label_safe(text: str) -> str:
    """A label value for free text (e.g. a grid name): kept if valid, else slug + digest."""
    if len(text) <= MAX_LABEL and LABEL_VALUE.match(text):
        return text
    return (slug(text, MAX_LABEL - 9) + "-" + _digest(text, 8)).strip("-")
