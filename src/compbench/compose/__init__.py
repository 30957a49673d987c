"""A run's configuration: Hydra composition with the recipes (config), the checks before
anything is written (checks), the compatibility rules and recipes (compat), and the
pipeline for a user's own script (wrap)."""
