"""Slurm: site profiles and job options (sites.py, options.py), sweeps, the job's plan (job.py:
JobPlan, every decision of the job script; preflight.py: what the GPU preflight checks) and the
report of a `verify --slurm` job (collect.py, placement.py).

The job script is written from the JobPlan by ``render/sbatch.py``; ``verify/slurm.py`` submits it.
"""
