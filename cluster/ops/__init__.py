"""Operator tooling: the `quorumgate` command line, cluster processes, recovery drills, and
the main job (`quorumgate demo`)."""
