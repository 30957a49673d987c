"""`compbench plan`: HiPress SeCoPa's cost model, fitted on this machine or from network settings."""
