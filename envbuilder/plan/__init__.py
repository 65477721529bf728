"""The plans made from a stack, that the renderers only format: the image's (image.py: stages and
steps; components/ build it, one component a file behind one interface) and the job's (job.py:
the JobPlan that job.sbatch is written from)."""
