"""The governance engine: pure, deterministic, no I/O (docs/engine.md).

It judges transactions in the format of `quorumgate.proto` (`model`, `codec`, `tx`,
`limits`, `names`, `chainversions`), which the replica's mempool and the client SDK share.
Its own modules, leaf first:

- `targets`    canonical targets (idna, rfc3986)
- `rules`      target and argument rules, named sets
- `secrets`    values shaped like secrets
- `statements` verdicts, confirmation cards, rejection artifacts and their canonical bytes
- `state`      the replicated state and its canonical serialization (`statetree`)
- `config`     `EngineConfig`, `config_for_cluster`, the configuration fingerprints
- `env`        what judging one transaction works on: config, state, block; its answers
- `scope`      the effective scope and rule layers along a grant chain
- `latch`      the denial latch, per run and across runs
- `quotas`     quotas on proposals in block time
- `arguments`  arguments: identity, declarations, envelopes and handles
- `confirm`    confirmation cards: holding a call, confirming or rejecting it
- `judge`      a proposal's decision, in the judging order
- `delegation` grants and revocations
- `envelopes`  sealing values to sinks as handles
- `admin`      owner operations, settings in the log, what principals may sign
- `core`       `Engine`: applies committed blocks, routes each transaction by kind
"""
