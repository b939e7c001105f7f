"""The governance engine (DESIGN §4.1-§4.8): pure, deterministic, no I/O.

Modules, leaf first:

- `limits`     every structural limit and the defaults of `EngineConfig`
- `names`      canonical tool, argument and identifier names; handles (stdlib only)
- `model`      domain types: transactions, mandates, tool specs, reason codes
- `codec`      the only module that touches protobuf (qgpb.tx_pb2 <-> model)
- `tx`         sign / verify / transaction id / parse; importable by the mempool and
               the client SDK without the rest of the engine
- `targets`    canonical targets (idna, rfc3986)
- `statements` verdicts, confirmation cards, rejection artifacts and their canonical bytes
- `state`      the replicated state and its canonical serialization
- `core`       `Engine` and `EngineConfig`

This package imports nothing on purpose, so that `sidecar.engine.tx` stays light.
"""
