"""Stand-in for Miles' train.py in tests/miles/test_miles_launch.py (Miles needs GPUs): the file
level of a Miles run. It parses the arguments the miles backend owns (unknown ones are Miles'
own and ignored here), records what it was given in ``seen.json`` beside itself, writes
TensorBoard scalars under Miles' tags with Miles' writer and steps (``SummaryWriter`` into
``$TENSORBOARD_DIR``: train/* at rollout * steps_per_rollout + i, rollout/* at the rollout) and
Megatron-layout checkpoints into ``--save`` (``iter_NNNNNNN``, then the tracker file), resuming
at the tracker's iteration + 1 of ``--load``. ``fail_at.txt`` beside it: die in that rollout;
``kl_scale.txt``: scale its rollout KL (a pool with less mismatch).
Run as the driver of a Ray cluster (``RAY_ADDRESS``, the Slurm path), it records the cluster's
GPUs and Slurm nodes as Miles' placement groups would find them."""
import argparse
import json
import os
import sys
import time
from pathlib import Path

from torch.utils.tensorboard import SummaryWriter

HERE = Path(__file__).resolve().parent
parser = argparse.ArgumentParser()
for flag in ("--num-rollout", "--save-interval", "--rollout-batch-size", "--n-samples-per-prompt",
             "--global-batch-size"):
    parser.add_argument(flag, type=int)
for flag in ("--save", "--load", "--custom-config-path", "--custom-tis-function-path"):
    parser.add_argument(flag)
args, _ = parser.parse_known_args()
start = 0
if args.load:
    start = int((Path(args.load) / "latest_checkpointed_iteration.txt").read_text()) + 1
mis = None
if args.custom_config_path:
    import yaml

    mis = yaml.safe_load(Path(args.custom_config_path).read_text())
ray_facts = None
if os.environ.get("RAY_ADDRESS"):
    # A driver of a Ray cluster started for it (Slurm): as Miles' placement groups would, ask
    # the cluster what it holds.
    import ray

    ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
    ray_facts = {"address": os.environ["RAY_ADDRESS"],
                 "gpus": ray.cluster_resources().get("GPU", 0),
                 "nodes": sorted(r for n in ray.nodes() if n["Alive"] for r in n["Resources"]
                                 if r.startswith("slurm_node_"))}
    ray.shutdown()
(HERE / "seen.json").write_text(json.dumps({
    "argv": sys.argv[1:], "cwd": os.getcwd(), "mis": mis, "python": sys.executable,
    "loaded_iteration": start - 1 if args.load else None, "ray": ray_facts}))
fail_at = int((HERE / "fail_at.txt").read_text()) if (HERE / "fail_at.txt").exists() else None
per_rollout = args.rollout_batch_size * args.n_samples_per_prompt // args.global_batch_size
writer = SummaryWriter(os.environ["TENSORBOARD_DIR"])
kl_scale = float((HERE / "kl_scale.txt").read_text()) if (HERE / "kl_scale.txt").exists() else 1.0
mis_on = args.custom_tis_function_path is not None and "mis" in args.custom_tis_function_path
for rollout in range(start, args.num_rollout):
    if rollout == fail_at:
        (HERE / "fail_at.txt").unlink()
        raise SystemExit(f"stand-in: dies in rollout {rollout}")
    writer.add_scalar("rollout/raw_reward", 0.25, rollout)
    writer.add_scalar("rollout/response_lengths", 100.0, rollout)
    for i in range(per_rollout):
        step = rollout * per_rollout + i
        writer.add_scalar("train/grad_norm", 1.0, step)
        writer.add_scalar("train/entropy_loss", -0.5, step)
        writer.add_scalar("train/train_rollout_kl", 0.1 * (rollout + 1) * kl_scale, step)
        if mis_on:
            writer.add_scalar("train/mis_k3_kl", 0.001 * (rollout + 1), step)
    writer.flush()
    if args.save and ((rollout + 1) % args.save_interval == 0 or rollout == args.num_rollout - 1):
        ckpt = Path(args.save) / f"iter_{rollout:07d}"
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "model.pt").write_text(f"rollout {rollout}")
        (Path(args.save) / "latest_checkpointed_iteration.txt").write_text(str(rollout))
    time.sleep(0.3)
writer.close()
