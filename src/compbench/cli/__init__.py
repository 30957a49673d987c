"""The command line: the entry point (main), the subcommands (commands), one run (run), sweeps
(sweep, sweep_launcher), the resumable matrix behind claims and race (matrix), shell
completion and introspection."""
