"""Kubernetes: the launcher of ``backend: k8s`` (``launcher``: each attempt of a verl trial is
one RayJob, followed through verl's files on the shared volume), KubeRay RayJobs per trial
(``render``), Kueue objects from the pool catalogue (``queues``, also ``python -m
orchestrator.k8s.queues``), name rules (``names``), cluster settings (``settings``),
submission/watching (``client``) and the dry run (``dryrun``).

Importing this package is cheap and imports none of its modules (``queues`` runs as a script);
the kubernetes client is imported by the functions that call the cluster.
"""
