"""CPU pre-flight of verl override lists against verl 0.9.1's own configuration system.

For each list: compose ``ppo_trainer`` with Hydra's compose API (unknown keys fail here),
instantiate the config dataclasses verl builds in the job, run verl's ``validate_config``, check
that bypass mode reaches the actor's loss (research/verl-0.9.1.md 1e), and dry-run the
rollout-correction helper (and the bypass loss) on dummy tensors, which is where bad *values*
surface: Hydra does not check them. Needs ``pip install -e '.[verl]'``; imports are local.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator.exceptions import BackendUnavailableError, GridError

_RC_FIELDS = ("rollout_is", "rollout_is_threshold", "rollout_is_batch_normalize", "rollout_rs",
              "rollout_rs_threshold", "bypass_mode", "loss_type")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:400]}"


@contextlib.contextmanager
def _shared_file_cache() -> Iterator[None]:
    """Let successive composes share Hydra's per-compose cache of loaded config files.

    Hydra re-reads and re-parses verl's ~40 yaml files on every compose (most of its ~0.3 s);
    the files do not change between composes and Hydra merges copies of them, so one cache is
    safe (tests/verl/test_trainer.py compares cached and uncached composes). Falls back
    to plain composes if Hydra's internals differ.
    """
    try:
        from hydra._internal import config_loader_impl as loader
    except ImportError:
        yield
        return
    original = getattr(loader.ConfigLoaderImpl, "_parse_overrides_and_create_caching_repo", None)
    if original is None:
        yield
        return
    shared: dict[str, Any] = {}

    def patched(self: Any, config_name: Any, overrides: Any) -> Any:
        parsed, repo = original(self, config_name, overrides)
        if isinstance(getattr(repo, "cache", None), dict):
            shared.update(repo.cache)
            repo.cache = shared
        return parsed, repo

    loader.ConfigLoaderImpl._parse_overrides_and_create_caching_repo = patched
    try:
        yield
    finally:
        loader.ConfigLoaderImpl._parse_overrides_and_create_caching_repo = original


@contextlib.contextmanager
def verl_config_dir(*, cache: bool = True) -> Iterator[Any]:
    """Hydra initialised on verl's ``trainer/config`` (cleared again afterwards)."""
    try:
        import verl
        from hydra import initialize_config_dir
        from hydra.core.global_hydra import GlobalHydra
    except ImportError as exc:
        raise BackendUnavailableError(f"verl is not installed ({exc.name}); run "
                                      "pip install -e '.[verl]' for the CPU pre-flight") from None
    cfg_dir = Path(verl.__file__).resolve().parent / "trainer" / "config"
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(cfg_dir), version_base=None), \
                (_shared_file_cache() if cache else contextlib.nullcontext()):
            yield cfg_dir
    finally:
        GlobalHydra.instance().clear()


def compose(overrides: Sequence[str]) -> Any:
    """verl's composed ``ppo_trainer`` config (call inside :func:`verl_config_dir`)."""
    from hydra import compose as hydra_compose

    return hydra_compose(config_name="ppo_trainer", overrides=list(overrides))


def preflight(override_lists: Iterable[Sequence[str]], *, label: str = "trial") -> int:
    """Check every override list; raise a one-line ``GridError`` on the first failure."""
    n = 0
    with verl_config_dir():
        for items in override_lists:
            try:
                cfg = compose(items)
            except Exception as exc:  # noqa: BLE001 - any compose failure is a config error
                raise GridError(f"verl's config rejects the overrides of {label}: "
                                f"{_one_line(exc)}", fix="check the key against verl 0.9.1's "
                                "ppo_trainer.yaml (python -m verl.trainer.main_ppo --cfg job)") from None
            check_composed(cfg, label=label)
            n += 1
    return n


def check_composed(cfg: Any, *, label: str = "trial") -> dict[str, Any]:
    """Instantiate and dry-run one composed config; returns the built dataclasses (for tests)."""
    try:
        built = _instantiate(cfg)
    except GridError:
        raise
    except Exception as exc:  # noqa: BLE001 - verl raises AssertionError/ValueError/TypeError
        raise GridError(f"verl rejects the config of {label}: {_one_line(exc)}",
                        fix="fix the value named above") from None
    return built


def _instantiate(cfg: Any) -> dict[str, Any]:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    get_adv_estimator_fn(cfg.algorithm.adv_estimator)  # verl only looks it up mid-job
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        critic = need_critic(cfg)
    if critic:
        raise GridError(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} needs a critic; "
                        "the verl backend runs critic-free GRPO-style jobs",
                        fix="algorithm.adv_estimator: grpo")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        algo = omega_conf_to_dataclass(cfg.algorithm)
        rc = omega_conf_to_dataclass(cfg.algorithm.rollout_correction, RolloutCorrectionConfig)
        actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)
        rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=False)
    check_engine_kwargs(rollout)
    if not rollout.calculate_log_probs:
        raise GridError("actor_rollout_ref.rollout.calculate_log_probs is false: no correction "
                        "and no mismatch metrics without the engine's log-probs")
    _check_bypass(rc, actor)
    _dry_run(rc, actor)
    return {"algorithm": algo, "rollout_correction": rc, "actor": actor, "rollout": rollout}


# vLLM's CUDA graph modes (vllm.config.compilation.CUDAGraphMode names).
VLLM_CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


def check_engine_kwargs(rollout: Any) -> None:
    """What verl does with ``engine_kwargs.<engine>`` before the engine sees it, done here: the
    chosen engine's kwargs must be a mapping of plain values, and vLLM's ``compilation_config``
    a JSON object verl can ``json.loads`` (vllm_async_server.py:307) with a known cudagraph_mode.
    """
    import json

    from omegaconf import DictConfig, OmegaConf

    kwargs = (rollout.engine_kwargs or {}).get(rollout.name) or {}
    if isinstance(kwargs, DictConfig):
        kwargs = OmegaConf.to_container(kwargs, resolve=True)
    if not isinstance(kwargs, dict):
        raise GridError(f"actor_rollout_ref.rollout.engine_kwargs.{rollout.name} is "
                        f"{type(kwargs).__name__}, not a mapping")
    text = kwargs.get("compilation_config")
    if rollout.name == "vllm" and text is not None:
        try:
            compilation = json.loads(text) if isinstance(text, str) else dict(text)
        except (ValueError, TypeError) as exc:
            raise GridError(f"engine_kwargs.vllm.compilation_config {text!r} is not JSON: "
                            f"{exc}") from None
        mode = compilation.get("cudagraph_mode")
        if mode is not None and mode not in VLLM_CUDAGRAPH_MODES:
            raise GridError(f"engine_kwargs.vllm.compilation_config cudagraph_mode {mode!r}; "
                            f"vLLM takes {', '.join(VLLM_CUDAGRAPH_MODES)}")


def _check_bypass(rc: Any, actor: Any) -> None:
    """Bypass must reach the actor's loss in verl 0.9.1 (V1 trainer), and only then."""
    mode = actor.policy_loss.loss_mode
    if bool(rc.bypass_mode) != (mode == "bypass_mode"):
        raise GridError(f"algorithm.rollout_correction.bypass_mode={rc.bypass_mode} but the actor "
                        f"loss_mode is {mode!r}: bypass would be silently ignored (or the loss "
                        "would treat pi_old as pi_rollout)",
                        fix="set both, as the verl backend's overrides do")
    if rc.bypass_mode:
        mirrored = actor.policy_loss.rollout_correction
        for name in _RC_FIELDS:
            # The '+' keys arrive as a plain dict; the loss reads them with .get() like this.
            got = mirrored.get(name) if isinstance(mirrored, dict) else getattr(mirrored, name)
            if got != getattr(rc, name):
                raise GridError(f"actor policy_loss.rollout_correction.{name}={got!r} differs "
                                f"from algorithm.rollout_correction.{name}={getattr(rc, name)!r}")


def _dry_run(rc: Any, actor: Any) -> None:
    """Run verl's correction helper (and the bypass loss) on small tensors with these values."""
    import torch
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

    gen = torch.Generator().manual_seed(0)
    shape = (4, 16)
    rollout_lp = -torch.rand(shape, generator=gen) * 2.0 - 0.05
    # A small mismatch, as a real job sees; the geometric band 0.999_1.001 may reject all of it.
    old_lp = rollout_lp + 1e-4 * torch.randn(shape, generator=gen)
    mask = torch.ones(shape)
    mask[:, 12:] = 0
    compute_rollout_correction_and_rejection_mask(
        old_log_prob=old_lp, rollout_log_prob=rollout_lp, response_mask=mask,
        rollout_is=rc.rollout_is, rollout_is_threshold=rc.rollout_is_threshold,
        rollout_is_batch_normalize=rc.rollout_is_batch_normalize, rollout_rs=rc.rollout_rs,
        rollout_rs_threshold=rc.rollout_rs_threshold)
    if rc.loss_type not in ("ppo_clip", "reinforce"):
        raise GridError(f"algorithm.rollout_correction.loss_type={rc.loss_type!r}; verl takes "
                        "ppo_clip or reinforce")
    if rc.bypass_mode:
        from verl.trainer.ppo.core_algos import get_policy_loss_fn

        loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
        adv = torch.randn(shape, generator=gen)
        loss, _ = loss_fn(old_log_prob=rollout_lp, log_prob=old_lp, advantages=adv,
                          response_mask=mask, loss_agg_mode=actor.loss_agg_mode, config=actor)
        if not torch.isfinite(loss):
            raise GridError(f"verl's bypass loss is {float(loss)} on dummy data")
