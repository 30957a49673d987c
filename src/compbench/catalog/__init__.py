"""The registry: every config group's options, as name -> "module:Class", imported lazily."""
