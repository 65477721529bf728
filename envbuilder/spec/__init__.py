"""The spec: one YAML file read safely (yamlsource.py), checked against its schema (schema.py)
into a validated ``Spec`` (model.py: load_spec), and the known-good presets in recipes/
(presets.py). The first stage of the pipeline; the stack (stack.py) is made from a Spec."""
