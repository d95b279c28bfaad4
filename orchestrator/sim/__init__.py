"""The CPU GRPO simulator behind the ``sim`` backend (see README.md in this directory).

Importing the package is cheap; the submodules ``model``, ``rollout``, ``trainer``, ``task``,
``correction_math`` (the ``correction.*`` vocabulary on tensors) and ``calibrate`` import torch,
``profile`` and ``config`` do not (plan-time checks use them).
"""
