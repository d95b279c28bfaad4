"""Run verl 0.9.1's real GRPO trainer on a CPU-only machine through verl's extension points.

Importing this package does nothing heavy. ``orchestrator.verl.cpu.plugin`` is the module named
in ``VERL_USE_EXTERNAL_MODULES``: verl imports it in the driver and in every Ray worker, and it
registers the CPU platform, the CPU rollout and the verl 0.9.1 patches there.
"""
