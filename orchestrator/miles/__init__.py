"""Miles (radixark/miles) as a trainer: a grid's ``backend: miles`` compiles each trial's
correction, engine and learner settings to Miles' ``train.py`` arguments and ``mis.yaml``
(``flags``), refuses at plan what Miles cannot express, and shows the exact command
(``trainer.MilesTrainer``). Checked against Miles' own argument parser in its environment
(``ablate gpu-env miles``: ``lock.txt``)."""
