"""What every QuorumGate process runs on, below the consensus core and the sidecar: gRPC
channels and server ports (pinned TLS, signed stream and read statements), read
authorization and its bounds, process start-up and fail-stop, one store transaction per
trip to aiosqlite's thread, and the latency trace lines."""
