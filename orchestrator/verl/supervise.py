"""Running one verl attempt on this machine: what it needs installed (and, on a gpu pool, its
GPUs), the job as a subprocess with its own Ray, the metric stream and checkpoints through
``files``, stop, the job's summary and diagnostics (what ended it, in one line).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.backends.base import AttemptOutcome, AttemptResult, RunContext
from orchestrator.backends.config import TrialConfig
from orchestrator.exceptions import BackendUnavailableError, InfraFailure
from orchestrator.pools import PoolSpec
from orchestrator.trial import TrialSpec
from orchestrator.verl import cpu_engines, engine_hook, vllm_cpu_setup
from orchestrator.verl.cpu.assets import asset_values
from orchestrator.verl.engine_choice import EngineChoice
from orchestrator.verl.files import (
    ZERO_ADV_METRIC,
    MetricTail,
    hand_over_checkpoint,
    loss_scaled,
    prepare_resume,
)
from orchestrator.verl.provenance import attempt_provenance
from orchestrator.verl.topology import config_value, ray_node_resources, world_size

POLL_SECONDS = 2.0
TERM_GRACE_SECONDS = 60.0
ZERO_ADV_PATIENCE = 3  # consecutive steps with all-zero advantages before reporting
# verl's rollout-correction helper on a batch without a response token (decoupled: the driver,
# bypass: the actor's loss); the job dies, and running it again would die the same way.
EMPTY_BATCH_ERRORS = ("must contain at least one valid token", "Expected at least one valid token")
RS_MASKED = "rollout_corr/rollout_rs_masked_fraction"  # bypass: actor/rollout_corr/..., mapped
CPU_MODULES = ("verl", "transfer_queue")  # what a cpu pool's job imports on this machine
# Lines after which a job never makes progress again (issue 37: verl's reload into vLLM-CPU's
# packed linears fails at the first sync, the sender's shared memory then refuses to close and
# the job hangs): the attempt ends at once as an infra failure naming the line.
FATAL_LOG_MARKERS = ("BufferError: cannot close exported pointers exist",
                     "object has no attribute 'weight_loader'",
                     "Sleep mode is not supported on current platform")
# A cpu pool's job that logs no step for this long (engine start included) is hung: an infra
# failure, never a wait without end. $ABLATE_VERL_STALL_SECONDS replaces it (any pool).
STALL_SECONDS = {"cpu": 900.0}
STALL_ENV = "ABLATE_VERL_STALL_SECONDS"


# --------------------------------------------------------------------------- the attempt


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Which of the modules ``names`` this interpreter cannot import (found without importing)."""
    out = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(name)
    return out


def require_cpu_verl(pools: Iterable[PoolSpec], *, where: str = "") -> None:
    """A cpu pool runs verl in this machine's processes: refuse one line early if it is absent."""
    names = sorted({p.name for p in pools if p.kind == "cpu"})
    if not names:
        return
    # verl 0.9.1 imports TransferQueue without declaring it (pyproject's verl extra does).
    missing = missing_modules(CPU_MODULES)
    if missing:
        raise BackendUnavailableError(
            f"{where}{': ' if where else ''}cpu pool(s) {', '.join(names)} run verl on this machine, and {', '.join(missing)} "
            "cannot be imported here; fix: pip install -e '.[verl]' (pinned: pip install -c "
            "tests/constraints.txt -e '.[verl]')")


def _require_local_devices(trial: TrialSpec, pool: PoolSpec, nodes: int, gpus: int,
                           spread: bool = False) -> None:
    """``spread``: the run context starts Ray across ``nodes`` nodes (a multi-node Slurm job),
    so this node needs only its own share."""
    if pool.kind == "cpu":
        require_cpu_verl([pool])
        if nodes > 1 and not spread:
            raise BackendUnavailableError(f"cpu pool {pool.name}: one node only (trainer.nnodes "
                                          f"is {nodes})")
        return
    missing = missing_modules(("verl", "sglang"))
    if missing:
        raise BackendUnavailableError(f"trial {trial.trial_id} needs {', '.join(missing)} on "
                                      "this machine: on a GPU node run ablate gpu-env sglang, then "
                                      "this command with that environment's ablate")
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if (nodes > 1 and not spread) or have < gpus:
        raise BackendUnavailableError(
            f"trial {trial.trial_id} needs {nodes} node(s) x {gpus} GPUs, this machine has {have} "
            "GPU(s); run it on its pool through the k8s backend (or a pool_catalog entry that "
            "matches this machine)")


def run_attempt(backend: Any, trial: TrialSpec, config: TrialConfig,
                ctx: RunContext) -> AttemptResult:
    """Run the job until it ends or ``ctx.should_stop()``; stream metrics and checkpoints."""
    from orchestrator.verl.cpu import procs, shm  # cpu pools only: process reaper, /dev/shm
    from orchestrator.verl.cpu.envvars import LOAD_LOG_ENV, SYNC_LOG_ENV

    nodes = world_size(ctx.pool, config) // ctx.pool.gpus_per_node
    # A context that can start Ray across several nodes (a multi-node Slurm job) offers it.
    spread = getattr(ctx, "ray_cluster", None) if nodes > 1 else None
    _require_local_devices(trial, ctx.pool, nodes, ctx.pool.gpus_per_node, spread is not None)
    work = Path(ctx.workdir)
    work.mkdir(parents=True, exist_ok=True)  # verl opens the logger path without creating dirs
    ckpt_dir = work / "verl_checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    log_path = work / f"metrics.attempt{ctx.attempt}.jsonl"
    resume_path = prepare_resume(ctx, ckpt_dir)
    # In-code assets live under the workdir of the grid (plan time shows $ABLATE_WORKDIR's).
    grid_dir = getattr(ctx, "grid_dir", None)
    assets_root = str(Path(grid_dir).parent / "assets" / "verl_cpu") if grid_dir else None
    if asset_values(config):
        build_assets(config, assets_root)
    # Its own Ray: never a cluster found through RAY_ADDRESS or on this node. Unix socket paths
    # are limited to ~107 bytes, so the temp dir is short.
    tag = uuid.uuid4().hex[:8]
    ray_tmp = f"/tmp/ablate-ray-{tag}"
    # The runner may expose the trial's MLflow child run (same attribute names as the k8s backend).
    uri = getattr(ctx, "tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
    # An inherited MLFLOW_RUN_ID belongs to some other run; only the trial's own may reach verl.
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_RUN_ID", "RAY_ADDRESS")}
    for key, value in backend.job_environment(
            trial, tracking_uri=uri, run_id=getattr(ctx, "mlflow_run_id", None),
            file_logger_path=str(log_path), pool=ctx.pool).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    # Evidence from inside the job (cpu pools): which processes loaded the plugin, and every
    # weight sync the rollout servers received. Kept with the trial, like the job's log.
    logs = Path(ctx.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    env[LOAD_LOG_ENV] = str(logs / f"plugin_loads.attempt{ctx.attempt}.jsonl")
    env[SYNC_LOG_ENV] = str(logs / f"weight_sync.attempt{ctx.attempt}.jsonl")
    # What the rollout engine really ran with (``provenance``): the CPU engine reports itself;
    # on GPU the hook reads SGLang's / vLLM's resolved settings in the server processes.
    engine_log = logs / f"engine.attempt{ctx.attempt}.jsonl"
    env[engine_hook.LOG_ENV] = str(engine_log)
    python = engine_launch(config, env)
    check_engine = _engine_check(config, engine_log)
    # verl imports the pool's plugin (VERL_USE_EXTERNAL_MODULES) from this checkout. An installed
    # rl-ablate is in the job's environment already (the vLLM-CPU one installs it too): its
    # directory is site-packages, whose packages must not shadow another environment's.
    if vllm_cpu_setup.ROOT is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(vllm_cpu_setup.ROOT), env.get("PYTHONPATH")) if p)
    # Ray's daemons detach from the job's process group; as a subreaper (for this attempt only)
    # this process inherits them when they are orphaned, so the reaping below finds everything
    # the job started, and the sampler reaps the dead ones at once (procs' docstring says why).
    log = logs / f"verl.attempt{ctx.attempt}.log"
    try:
        with procs.subreaper(), open(log, "ab") as out, procs.RssSampler() as sampler, \
                contextlib.ExitStack() as ray_cluster:
            before = frozenset(p.pid for p in procs.descendants())
            shm_before = shm.snapshot()
            address = None
            if spread is not None:  # Ray on every node first, with the env the driver gets
                num_cpus, num_gpus = ray_node_resources(ctx.pool)
                address, joined = ray_cluster.enter_context(spread(
                    env, log_dir=logs, num_cpus=num_cpus, num_gpus=num_gpus, tag=tag))
                ctx.describe_environment({"ray.address": address, "ray.nodes": ",".join(joined)})
            argv = backend.command(trial, config, checkpoint_dir=str(ckpt_dir),
                                   resume_path=resume_path, save_freq=ctx.checkpoint_every,
                                   python=python, assets_root=assets_root,
                                   ray_temp_dir=None if address else ray_tmp, ray_address=address)
            started = time.monotonic()
            proc = subprocess.Popen(argv, cwd=work, env=env, stdout=out,
                                    stderr=subprocess.STDOUT,
                                    start_new_session=True,  # its own process group, for stop
                                    preexec_fn=procs.die_with_parent())  # noqa: PLW1509
            try:
                # An evaluation job (``reference_job``: verl's val_only) logs its one
                # validation at the resume step itself.
                first = (ctx.resume_step or 0) - bool(config_value(config, "trainer.val_only"))
                result = _watch(proc, trial, ctx, MetricTail(log_path, first, loss_scaled(config)),
                                ckpt_dir, log, check_engine)
            finally:
                if proc.poll() is None:
                    terminate(proc)
                ray_cluster.close()  # the Ray nodes this attempt started, by pid, gracefully
                reaped = procs.kill_tree(keep=before)
                shm_removed = shm.remove_new(shm_before)
                summary = write_job_summary(logs / f"job.attempt{ctx.attempt}.json", proc,
                                            started, sampler, reaped)
                provenance, _ = attempt_provenance(config, engine_log)
                facts = job_facts(ctx.pool, summary)
                facts["verl.job.shm_segments_removed"] = str(len(shm_removed))
                facts["verl.rollout"] = provenance.facts["engine.name"]
                ctx.describe_environment({**facts, **provenance.facts})
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    warning = provenance.warning()
    if warning:
        print(f"[{trial.trial_id}] {warning}", file=sys.stderr)
    return dataclasses.replace(result, reason=_join(result.reason, warning))


def _engine_check(config: TrialConfig, engine_log: Path) -> Any:
    """With ``rollout.provenance: strict``: a function the watcher calls once the first step is
    in (the engine has started), which returns why the attempt must end, or None."""
    def check() -> str | None:
        provenance, strict = attempt_provenance(config, engine_log)
        problem = provenance.warning()
        return f"rollout.provenance: strict and {problem}" if strict and problem else None
    return check


def engine_launch(config: TrialConfig, env: dict[str, str]) -> str:
    """The Python the job runs with; adds to ``env`` what its rollout engine needs. vLLM on a
    cpu pool: the vLLM-CPU environment's Python, with the variables its platform needs, and the
    hook reads its VllmConfig as on a gpu pool (where the hook is loaded too)."""
    choice = EngineChoice.of(config.rollout, config.pool, config)
    env.update(choice.job_env())
    if config.pool.kind == "gpu" or choice.vllm_cpu:
        env["VERL_USE_EXTERNAL_MODULES"] = ",".join(filter(None, (
            env.get("VERL_USE_EXTERNAL_MODULES"), engine_hook.__name__)))
    return str(cpu_engines.python(config.pool)) if choice.vllm_cpu else sys.executable


def build_assets(config: Mapping[str, Any], root: str | None = None) -> Path:
    """Build (or reuse) the recipe's in-code model, tokenizer and data; returns the entry."""
    from orchestrator.verl.cpu import assets  # builds with transformers: cpu recipes only

    return assets.build(assets.spec_from_recipe(dict(config["assets"])), assets.assets_cache(root)).root


def write_job_summary(path: Path, proc: subprocess.Popen[bytes], started: float, sampler: Any,
                      reaped: list[int]) -> dict[str, Any]:
    """Wall time, peak RSS of every process of the job and what was reaped (for figures); the
    file also names each process the job ran (pid: last command line seen), the evidence the
    plugin-load log is checked against."""
    summary = {"exit_code": proc.returncode, "wall_seconds": round(time.monotonic() - started, 1),
               "peak_rss_gb_all_processes": round(sampler.peak.rss_bytes / 2**30, 3),
               "processes_at_peak": sampler.peak.processes, "max_processes": sampler.peak_processes,
               "leftover_processes_reaped": len(reaped)}
    titles = {str(pid): title for pid, title in sorted(sampler.titles.items())}
    path.write_text(json.dumps({**summary, "processes": titles}, indent=2, sort_keys=True))
    return summary


def job_facts(pool: PoolSpec, summary: Mapping[str, Any]) -> dict[str, str]:
    """Where the attempt computed and what the whole job cost (attempts.json, MLflow tags)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        verl_version = version("verl")
    except PackageNotFoundError:
        verl_version = "missing"
    rollout = pool.verl_overrides.get("actor_rollout_ref.rollout.name", "sglang")
    facts = {"verl.version": verl_version, "verl.pool_kind": pool.kind, "verl.rollout": rollout,
             "verl.platform": pool.verl_env.get("VERL_PLATFORM") or "auto"}
    facts.update({f"verl.job.{k}": str(v) for k, v in summary.items()})
    return facts


def empty_step(step: int, data: Mapping[str, float]) -> str | None:
    """Why step ``step`` trained on nothing, or None: the correction rejected every token.

    The simulator refuses such an update (``correction_math.empty_update``); verl takes it (a NaN
    loss in decoupled mode, which the nonfinite rule catches, a silent 0 in bypass mode), so the
    attempt is ended here as the same numeric failure.
    """
    if data.get(RS_MASKED, 0.0) >= 1.0:
        return (f"step {step}: every response token was rejected ({RS_MASKED} = 1), so the "
                "update had nothing to train on")
    return None


def _watch(proc: subprocess.Popen[bytes], trial: TrialSpec, ctx: RunContext, tail: MetricTail,
           ckpt_dir: Path, log: Path, check_engine: Any = None) -> AttemptResult:
    saved = fed = ctx.resume_step or 0  # fed: the last step given to the run context
    zero_run, warning = 0, None
    stop_reason = empty = unapplied = None
    watch = _LogWatch(log, _stall_seconds(getattr(getattr(ctx, "pool", None), "kind", "")))
    while True:
        finished = proc.poll() is not None
        for step, data in tail.poll():
            watch.progress()
            if check_engine is not None:  # once: the engine has started by the first step
                unapplied, check_engine = check_engine(), None
            if unapplied:
                break  # the step ran on an engine that ignored a flag: not recorded
            # verl runs ahead of this loop: once the context asks to stop (or a step trained
            # on nothing), no later step is recorded, as an in-process trainer would not run it.
            stop_reason = stop_reason or ctx.should_stop()
            if stop_reason or empty:
                break
            ctx.log_metrics(step, data)
            fed = step
            empty = empty or empty_step(step, data)
            zero_run = zero_run + 1 if data.get(ZERO_ADV_METRIC) == 1.0 else 0
            if zero_run >= ZERO_ADV_PATIENCE and warning is None:
                warning = group_diversity_warning(step, data)
                print(f"[{trial.trial_id}] {warning}", file=sys.stderr)
        if not unapplied:
            saved = hand_over_checkpoint(ctx, ckpt_dir, saved, fed)
        if finished:
            break
        stop_reason = stop_reason or ctx.should_stop()
        if stop_reason or empty or unapplied:
            terminate(proc)
            continue
        hung = watch.problem()
        if hung:
            terminate(proc)
            for step, data in tail.poll():  # steps logged before the end still count
                ctx.log_metrics(step, data)
            raise InfraFailure(f"{hung} after step {tail.last_logged}; see {log}")
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POLL_SECONDS)  # returns at once when the job ends
    last = fed
    if unapplied:
        raise InfraFailure(unapplied)
    if empty:
        return AttemptResult(AttemptOutcome.NUMERIC_FAILURE, last, reason=_join(empty, warning))
    if stop_reason:
        return AttemptResult(AttemptOutcome.STOPPED, last, reason=_join(stop_reason, warning))
    if proc.returncode != 0:
        why = _last_error(log)
        if any(marker in _log_tail(log) for marker in EMPTY_BATCH_ERRORS):
            return AttemptResult(AttemptOutcome.NUMERIC_FAILURE, last, reason=(
                f"verl stopped after step {last} on a batch without a response token, which "
                f"its rollout-correction helper refuses: {why}"))
        raise InfraFailure(f"verl exited with code {proc.returncode} after step {last}: {why}")
    if last < trial.steps:
        raise InfraFailure(f"verl exited cleanly after step {last} of {trial.steps} (data "
                           "exhausted or a step was not logged); see " + str(log))
    return AttemptResult(AttemptOutcome.COMPLETED, last, reason=warning)


def _stall_seconds(pool_kind: str) -> float | None:
    value = os.environ.get(STALL_ENV)
    try:
        return float(value) if value else STALL_SECONDS.get(pool_kind)
    except ValueError:
        return STALL_SECONDS.get(pool_kind)


class _LogWatch:
    """A job that will make no more progress: a fatal line in its log (read incrementally) or
    no step for ``stall`` seconds."""

    def __init__(self, log: Path, stall: float | None) -> None:
        self.log, self.stall, self.offset = log, stall, 0
        self.last = time.monotonic()

    def progress(self) -> None:
        self.last = time.monotonic()

    def problem(self) -> str | None:
        with contextlib.suppress(OSError), open(self.log, "rb") as fh:
            fh.seek(max(0, self.offset - 200))  # a marker split across two reads
            chunk = fh.read().decode(errors="replace")
            self.offset = fh.tell()
            for line in chunk.splitlines():
                if any(marker in line for marker in FATAL_LOG_MARKERS):
                    return f"the job failed and will not recover: {line.strip()[:300]}"
        if self.stall is not None and time.monotonic() - self.last > self.stall:
            return (f"the job logged no step for {self.stall:.0f} s (hung; {STALL_ENV} sets "
                    "the bound)")
        return None


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the job's process group (Ray, SGLang servers), then SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_SECONDS), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def group_diversity_warning(step: int, data: Mapping[str, float]) -> str:
    """The run-time face of the seed-42 trap (research/verl-0.9.1.md section 4)."""
    spread = data.get("critic/score/max", 0.0) - data.get("critic/score/min", 0.0)
    why = (" while rewards differ across prompts (score spread "
           f"{spread:.3g}), so the samples within each group look identical") if spread > 0 else ""
    return (f"every GRPO advantage has been 0 for {ZERO_ADV_PATIENCE} steps up to step {step}"
            f"{why}; the policy is not learning. If SGLang runs deterministic / "
            "rl_on_policy_target without per-request sampling seeds, all rollout.n samples are "
            "the same; fix: turn deterministic inference off, or raise rollout.n / data difficulty")


def _join(*parts: str | None) -> str | None:
    text = "; ".join(p for p in parts if p)
    return text or None


def _log_tail(log: Path) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-200:])
    except OSError:
        return ""


def _last_error(log: Path, lines: int = 5) -> str:
    tail = _log_tail(log).splitlines()
    if not tail:
        return "(no log)"
    picked = [ln for ln in tail if "Error" in ln or "error" in ln][-lines:] or tail[-lines:]
    return " | ".join(s.strip() for s in picked)[:600]
