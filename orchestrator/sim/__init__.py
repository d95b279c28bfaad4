"""The CPU GRPO simulator behind the ``sim`` backend (see README.md in this directory), and its
trainer (``job.SimTrainer``: plan-time checks, the metrics it emits, one attempt of a trial).

Importing the package is cheap; the submodules ``model``, ``rollout``, ``trainer``, ``task``,
``correction_math`` (the ``correction.*`` vocabulary on tensors) and ``calibrate`` import torch,
``profile``, ``config`` and ``job`` do not (plan-time checks use them).
"""
