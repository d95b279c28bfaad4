"""verl 0.9.1 as a trainer (``trainer.VerlTrainer``): everything the orchestrator knows about verl.

Plan time, importing no verl: ``mapping`` (corrections and rollout flags as verl keys, keys the
trainer owns), ``engines`` (the SGLang and vLLM tables: which flag exists, where it applies,
what it refuses), ``learner`` (the ``learner.*`` vocabulary as verl keys), ``memory`` (a model
too large for a cpu pool), ``topology`` (world size, checkpoint portability across pools) and
``preflight`` (a dry compose in verl's own config system). Run time: ``files`` (verl's file
protocol: the metric log and ``global_step_N`` checkpoints, read by every launcher),
``supervise`` (one attempt as a local subprocess), ``engine_hook`` and ``provenance`` (what the
rollout engine really ran with), and ``cpu`` (the CPU platform and rollout engine that run
verl's real trainer on a cpu pool).

Importing this package imports none of its modules.
"""
