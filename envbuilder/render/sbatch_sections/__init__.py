"""The longer bash sections of job.sbatch, one file per concern, each formatting its part of the
JobPlan (slurm/job.py): nodelocal.py (the node-local folder, its removal, the node step),
staging.py, preflight.py (the GPU preflight), tfconfig.py (TF_CONFIG per task), vetting.py (node
vetting). render/sbatch.py puts them in order.
"""
