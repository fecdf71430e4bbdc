"""KFP pipeline definitions; the compiled YAML is a build output (``dockflow pipeline compile``)."""
