"""A grid name stands for one grid, end to end on the suite's cluster: another grid under the
name is refused before anything runs; growing the grid (a seed more) runs only the new trial;
``--name`` runs the other grid on its own; ``--extend`` adds its trials to the existing one."""

from __future__ import annotations

from pathlib import Path

import pytest
import relhelpers as H

from orchestrator.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("double")]


def test_identity_refusal_growth_rename_and_extend(
    isolated: Path, cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c, _nodes = cluster
    work = isolated / ".ablate"
    uri = f"sqlite:///{work / 'mlflow.db'}"

    def grid(file: str, steps: int, seeds: list[int]) -> str:
        return str(H.write_grid(isolated / file, "ident", steps=steps, seeds=seeds,
                                levels=["token"], pools=["sim-h100"], tiny=False))

    def submit(*args: str) -> tuple[int, str]:
        capsys.readouterr()
        rc = main(["submit", *args, "--address", c.address, "--no-progress"])
        return rc, capsys.readouterr().err

    first, longer, grown = grid("a.yaml", 10, [0]), grid("b.yaml", 15, [0]), grid("c.yaml", 10, [0, 1])
    assert submit(first)[0] == 0
    (old,) = H.trials(work / "ident")

    rc, err = submit(longer)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {longer}: grid 'ident' already ran in {work} with other trials "
                          "(steps: 10 -> 15); fix: submit it under a new name (`--name NEW`")
    assert list(H.trials(work / "ident")) == [old]  # nothing ran

    rc, err = submit(grown)
    assert rc == 0 and "grid ident grows: seeds: [0] -> [0, 1]; 1 new trial(s)" in err, err
    trials = H.trials(work / "ident")
    assert len(trials) == 2 and len(trials[old]["attempts"]) == 1  # the old trial did not run again
    H.check_exactly_once(work / "ident", uri, steps=10)

    assert submit(longer, "--name", "ident-15")[0] == 0
    ((tid15, t15),) = H.trials(work / "ident-15").items()
    assert t15["state"].last_step == 15 and len(H.trials(work / "ident")) == 2
    capsys.readouterr()
    assert main(["compare", longer, "--name", "ident-15", "--out", str(isolated / "r15")]) == 0
    table = (isolated / "r15" / "trials.csv").read_text()
    assert tid15 in table and not any(t in table for t in H.trials(work / "ident"))

    rc, err = submit(longer, "--extend")
    assert rc == 0 and "grid ident extended (--extend): " in err and "steps: 10 -> 15" in err, err
    assert sorted(t["state"].last_step for t in H.trials(work / "ident").values()) == [10, 10, 15]
