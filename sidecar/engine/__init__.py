"""The governance engine (DESIGN §4.1-§4.8): pure, deterministic, no I/O.

It judges transactions in the format of `quorumgate.proto` (`model`, `codec`, `tx`,
`limits`, `names`), which the replica's mempool and the client SDK share. Its own modules,
leaf first:

- `targets`    canonical targets (idna, rfc3986)
- `statements` verdicts, confirmation cards, rejection artifacts and their canonical bytes
- `state`      the replicated state and its canonical serialization
- `core`       `Engine` and `EngineConfig`
"""
