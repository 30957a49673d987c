"""What a run records: results.json's schema and summary, step clocks and statistics, wire
floors, provenance (commit, CPU, load) and the run folder."""
