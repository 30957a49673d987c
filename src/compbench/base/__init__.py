"""The foundation every layer stands on: errors and exit codes, value checks, the argument parser,
the settings' declarations, plugin discovery, kernel sources, torchvision compatibility."""
