"""Slurm: site profiles, sweeps, data staging, and `verify --slurm` (submit + collect).

The job script itself is rendered by ``render/sbatch.py``; this package computes what goes
into it (``options.job_cluster``) and runs it for real (``submit``, ``collect``).
"""
