"""The Slurm side of ``backend: slurm`` (and ``slurm-miles``): each attempt of a trial is one
batch job.

``launcher`` submits an attempt's job and follows it (the launcher of ``backend: slurm``);
``script`` turns a pool's ``slurm:`` block and the in-job command into sbatch options and a job
script (argument lists, each word ``shlex.quote``d); ``client`` calls sbatch, squeue, scontrol,
sacct, scancel and sinfo; ``events`` is the file protocol between the job and the orchestrator;
``worker`` is what the job runs; ``raycluster`` (with ``raynode`` on the other nodes) starts Ray
across an allocation (a multi-node verl trial, every Miles trial); ``dryrun`` writes every job
script of a grid.

The cluster and this machine share a filesystem: the job runs the same Python
(``sys.executable``) from the same checkout and writes under the orchestrator's workdir.
"""
