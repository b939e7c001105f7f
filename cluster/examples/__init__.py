"""Examples: the multi-agent orchestrator the main job runs."""
