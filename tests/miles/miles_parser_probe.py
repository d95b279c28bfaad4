"""Run in the Miles environment (``ablate gpu-env miles``) by ``test_miles_parser.py``: each
case's ``train.py`` arguments through Miles' own ``parse_args`` (Megatron's parser, Miles'
``miles_validate_args``, SGLang's server arguments as Miles prefixes them), and Miles' own
true-on-policy launch plan of the parsed arguments.

stdin: ``{"cases": {name: {"argv": [...], "env": {...}}}, "attrs": [...]}`` (``env``: the job's
environment, set while its case parses). stdout: one JSON object, per case the
attributes asked for (or the error Miles raised), the launch plan's arguments and environment,
and Miles' true-on-policy model names.

The one stand-in: Megatron's ``validate_args`` asks the GPU's compute capability (its
``get_device_arch_version`` and ``torch.cuda.get_device_capability``, megatron/training/
arguments.py:852 and 927), which this machine has none to answer; the probe answers for the
pool's accelerator (a case's ``capability``: [9, 0] for an H100). Nothing else is replaced.
"""
import contextlib
import io
import json
import os
import sys


def main() -> None:
    request = json.load(sys.stdin)
    import megatron.training.arguments as megatron_arguments
    import torch

    gpu = {"capability": [9, 0]}  # the pool's accelerator's, per case
    megatron_arguments.get_device_arch_version = lambda: gpu["capability"][0]
    torch.cuda.get_device_capability = lambda *_: tuple(gpu["capability"])
    from miles.true_on_policy import build_true_on_policy_launch_plan
    from miles.true_on_policy.model_profiles import _PROFILE_BY_MODEL_NAME
    from miles.utils.arguments import parse_args

    out = {"cases": {}, "true_on_policy_models": sorted(_PROFILE_BY_MODEL_NAME)}
    for name, case in request["cases"].items():
        sys.argv = ["train.py", *case["argv"]]
        gpu["capability"] = case.get("capability", [9, 0])
        saved = dict(os.environ)
        os.environ.update(case["env"])
        said = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
                args = parse_args()
        except (AssertionError, ValueError, SystemExit, TypeError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc} {said.getvalue().strip()[-1500:]}"
            out["cases"][name] = {"error": error}
            continue
        finally:
            os.environ.clear()
            os.environ.update(saved)
        # Miles' plan reads args.true_on_policy; its parser spells the switch true_on_policy_mode.
        args.true_on_policy = args.true_on_policy_mode
        plan = build_true_on_policy_launch_plan(args)
        out["cases"][name] = {
            "attrs": {a: getattr(args, a, "<absent>") for a in request["attrs"]},
            "plan_args": plan.train_args.split() if plan.enabled else [],
            "plan_env": {k: v for k, v in plan.env_vars.items()} if plan.enabled else {},
        }
    print(json.dumps(out, default=str))


if __name__ == "__main__":
    main()
