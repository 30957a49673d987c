"""`compbench race`: which method reaches a target quality first over a given link, measured on
shaped links with real engines and predicted for others (compbench.race.model)."""
