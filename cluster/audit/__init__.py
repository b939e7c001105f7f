"""The verdict ledger's copy in PostgreSQL for auditors (docs/audit.md): `quorumgate ship`
follows f+1 sidecars and writes certified, hash-linked verdicts in idempotent batches;
`quorumgate audit verify` checks the copy on its own against the cluster file."""
