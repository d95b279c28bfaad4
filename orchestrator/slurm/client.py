"""Slurm's command-line clients, called with argument lists (never a shell).

Why not submitit: it pickles a Python callable into the job (no pickle on disk here) and reads
job states from ``sacct``, which needs accounting storage that many clusters (and the test
cluster) lack. A job's state comes from ``squeue``/``scontrol`` while the controller knows it
(``MinJobAge`` after its end), then from ``sacct`` where accounting is on; the backend falls back
to the job's own result record when neither knows it.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

from orchestrator.exceptions import BackendUnavailableError, InfraFailure, UserError

log = logging.getLogger(__name__)

CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")
INSTALL = ("install Slurm's clients (Debian: apt-get install slurm-client) and point "
           "SLURM_CONF at the cluster's slurm.conf, or use --backend sim")
# Job states after which the job runs no more (squeue/scontrol/sacct spellings).
FINISHED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
            "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT"}
# Infra endings: the node, the scheduler or a limit ended the job, not the training.
PREEMPTION = {"PREEMPTED"}


# ``squeue -O``: the fields ``state`` reads from ``scontrol show job``, "|"-separated.
SQUEUE_FORMAT = "JobID:|,State:|,Reason:|,RestartCnt:|,exit_code:|,NodeList:|"


class SlurmError(InfraFailure):
    """A Slurm client failed for a reason that is not the user's input (controller down)."""


@dataclasses.dataclass(frozen=True)
class JobState:
    """One job as the controller (or accounting) reports it."""

    job_id: str
    state: str  # e.g. PENDING, RUNNING, COMPLETED, NODE_FAIL
    reason: str = ""
    restarts: int = 0  # times Slurm requeued it
    exit_code: str = ""
    nodes: str = ""

    @property
    def finished(self) -> bool:
        return self.state in FINISHED

    def describe(self) -> str:
        bits = [self.state] + [f"reason {self.reason}" for _ in [0] if self.reason not in ("", "None")]
        if self.exit_code and self.exit_code != "0:0":
            bits.append(f"exit code {self.exit_code}")
        if self.nodes:
            bits.append(f"on {self.nodes}")
        return ", ".join(bits)


@dataclasses.dataclass(frozen=True)
class ClusterFacts:
    """What ``sinfo`` says the cluster offers: partitions -> nodes, and per node its features
    and GRES."""

    partitions: dict[str, tuple[str, ...]]
    features: dict[str, frozenset[str]]
    gres: dict[str, tuple[str, ...]]


def missing_clients() -> list[str]:
    return [exe for exe in CLIENTS if shutil.which(exe) is None]


class SlurmClient:
    """sbatch/squeue/scontrol/sacct/scancel/sinfo of the cluster in ``SLURM_CONF`` (or the
    default configuration)."""

    def __init__(self, timeout: float = 30.0) -> None:
        self.timeout = timeout

    def _run(self, argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
        try:
            res = subprocess.run(list(argv), capture_output=True, text=True, timeout=self.timeout,
                                 check=False,
                                 env=os.environ.copy(), stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise BackendUnavailableError(f"slurm: {argv[0]} not found; {INSTALL}") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"infra_failure: {argv[0]} gave no answer in {self.timeout:.0f} s "
                             "(is slurmctld up?)") from None
        if check and res.returncode:
            raise SlurmError(f"infra_failure: {' '.join(argv[:2])} failed: {_last(res.stderr)}")
        return res

    # ------------------------------------------------------------------ jobs

    def submit(self, script: str, *, pool: str, output: str) -> str:
        """sbatch ``script`` (its ``#SBATCH`` lines place it), its log to ``output``; returns
        the job id. A request the cluster refuses (partition, account, qos, GRES) is a user
        error naming ``pool``."""
        res = self._run(["sbatch", "--parsable", f"--output={output}", script], check=False)
        if res.returncode:
            raise refusal(pool, res.stderr)
        return res.stdout.strip().split(";")[0]

    def test_only(self, options: Sequence[str], script: str, *, pool: str) -> None:
        """``sbatch --test-only``: would the cluster ever run this request? Raises the refusal
        (partition, GRES, features that no node has) as a user error naming ``pool``."""
        res = self._run(["sbatch", "--test-only", *options, script], check=False)
        if res.returncode:
            raise refusal(pool, res.stderr)

    def state(self, job_id: str) -> JobState | None:
        """The job's state, or None when neither the controller nor accounting knows it."""
        res = self._run(["scontrol", "-o", "show", "job", job_id], check=False)
        if res.returncode == 0 and res.stdout.strip():
            f = dict(re.findall(r"(\w[\w/:]*)=(\S*)", res.stdout))
            return JobState(job_id, f.get("JobState", "UNKNOWN"), f.get("Reason", ""),
                            int(f.get("Restarts", "0") or 0), f.get("ExitCode", ""),
                            f.get("NodeList", "").replace("(null)", ""))
        return self._accounted(job_id)

    def states(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        """The states of all of ``job_ids`` in at most two calls: one ``squeue`` (the controller,
        finished jobs included until ``MinJobAge``) and, for the jobs it no longer lists, one
        ``sacct``. A job neither knows is absent from the answer (``state`` would say None)."""
        ids = sorted(set(job_ids), key=lambda j: (len(j), j))
        if not ids:
            return {}
        res = self._run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-O", SQUEUE_FORMAT],
                        check=False)
        found: dict[str, JobState] = {}
        if res.returncode == 0:
            wanted = set(ids)
            for line in res.stdout.splitlines():
                job = _squeue_row(line)
                if job is not None and job.job_id in wanted:
                    found[job.job_id] = job
        # A non-zero exit: "Invalid job id" when squeue knows none of them, or a controller
        # that did not answer; either way the jobs are asked of accounting, as ``state`` does.
        missing = [j for j in ids if j not in found]
        if missing:
            found.update(self._accounted_many(missing))
        return found

    def _accounted_many(self, job_ids: Sequence[str]) -> dict[str, JobState]:
        if shutil.which("sacct") is None:
            return {}
        res = self._run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o",
                         "JobID,State,Reason,ExitCode,NodeList"], check=False)
        if res.returncode:
            return {}
        wanted, out = set(job_ids), {}
        for line in res.stdout.splitlines():  # the last row of a job is its latest
            job, state, reason, code, nodes = (line.split("|") + ["", "", "", "", ""])[:5]
            if job in wanted and state.strip():
                out[job] = JobState(job, state.split()[0], reason, 0, code, nodes)
        return out

    def _accounted(self, job_id: str) -> JobState | None:
        if shutil.which("sacct") is None:
            return None
        res = self._run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o",
                         "State,Reason,ExitCode,NodeList"], check=False)
        line = res.stdout.strip().splitlines()[-1:] if res.returncode == 0 else []
        if not line:
            return None  # accounting off, or it does not know the job
        state, reason, code, nodes = (line[0].split("|") + ["", "", "", ""])[:4]
        return JobState(job_id, state.split()[0], reason, 0, code, nodes)

    def jobs_named(self, name: str) -> list[str]:
        """Ids of this user's jobs named ``name`` that have not finished."""
        res = self._run(["squeue", "-h", "--me", "-n", name, "-o", "%i"])
        return [j for j in res.stdout.split() if j]

    def cancel(self, job_id: str) -> None:
        self._run(["scancel", job_id], check=False)  # a job that already ended is fine

    # ------------------------------------------------------------------ cluster

    def facts(self) -> ClusterFacts:
        res = self._run(["sinfo", "-h", "-N", "-o", "%N|%R|%f|%G"])
        parts: dict[str, list[str]] = {}
        features: dict[str, frozenset[str]] = {}
        gres: dict[str, tuple[str, ...]] = {}
        for line in res.stdout.splitlines():
            node, part, feats, g = (line.split("|") + ["", "", ""])[:4]
            parts.setdefault(part.rstrip("*"), []).append(node)
            features[node] = frozenset(x for x in feats.split(",") if x and x != "(null)")
            gres[node] = tuple(x for x in re.split(r",(?![^()]*\))", g) if x and x != "(null)")
        return ClusterFacts({p: tuple(n) for p, n in parts.items()}, features, gres)


def cancel_quietly(client: Any, job_id: str) -> None:
    """``client.cancel(job_id)`` after an error: a failure to cancel is logged, never raised
    (the original error is the one to report)."""
    try:
        client.cancel(job_id)
    except Exception:
        log.exception("could not cancel Slurm job %s after an error", job_id)


def refusal(pool: str, stderr: str) -> UserError:
    """sbatch's refusal as one line naming the pool's key and the fix."""
    text = _last(stderr)
    low = text.lower()
    key, fix = "slurm", "check the pool's slurm: block against `sinfo` and `sacctmgr show assoc`"
    for word, k, f in (
        # account first: sbatch says "Invalid account or account/partition combination"
        ("account", "account", "name an account you belong to (`sacctmgr show assoc user=$USER`)"),
        ("qos", "qos", "name a QOS your association allows (`sacctmgr show assoc`)"),
        ("gres", "gres", "name a GRES a node of the partition has (`sinfo -o '%P %G'`)"),
        ("partition", "partition", "name a partition `sinfo -s` lists"),
        ("node configuration is not available", "gres/constraint",
         "no node of the partition has the GRES and features asked for (`sinfo -o '%P %f %G'`)"),
        ("time limit", "time_limit", "ask for a time limit the partition allows (`sinfo -s`)"),
    ):
        if word in low:
            key, fix = k, f
            break
    return UserError(f"pool {pool}: slurm.{key}: sbatch refused the job: {text}; fix: {fix}")


def _squeue_row(line: str) -> JobState | None:
    """One ``SQUEUE_FORMAT`` row; ``exit_code`` there is the raw wait status (768 is 3:0)."""
    parts = line.strip().split("|")
    if len(parts) < 6 or not parts[0]:
        return None
    job, state, reason, restarts, status, nodes = (p.strip() for p in parts[:6])
    try:
        raw = int(status)
        code = f"{raw >> 8}:{raw & 0x7F}"
    except ValueError:
        code = status
    return JobState(job, state.split()[0] if state else "UNKNOWN", reason,
                    int(restarts) if restarts.isdigit() else 0, code,
                    nodes.replace("(null)", ""))


def _last(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "(no message)"
