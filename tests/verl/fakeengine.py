"""An installed-looking engine package for the tests (vLLM and SGLang cannot be installed on
this CPU machine): its files under ``root/name`` and a ``dist-info`` carrying its version."""
from __future__ import annotations

from pathlib import Path


def fake_engine(root: Path, name: str, version: str, files: dict[str, str]) -> None:
    for rel, text in {"__init__.py": "", **files}.items():
        (root / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / name / rel).write_text(text)
    meta = root / f"{name}-{version}.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
