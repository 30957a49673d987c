"""Error-feedback memories: one file each; file name = config name = registry name."""
