"""Emulated links: network namespaces, veth pairs and tc shaping for local jobs (netem)."""
