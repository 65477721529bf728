"""envbuilder: one YAML spec to a validated deep-learning container for HPC clusters."""

__version__ = "0.1.0"
