"""The enforcing proxy for model APIs (docs/proxy.md): govern an agent whose code you cannot
change. It sits at the agent's model base URL, forwards every request upstream unchanged,
and releases a tool call the model asks for only with a verified f+1 certificate that allows
it (`quorumgate proxy`; `config.py` the agents file, `enforce.py` the pure enforcement core,
`app.py` the HTTP shell)."""
