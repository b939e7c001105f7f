"""The client SDK: clients, governed tools, the tool executor, owner operations.

Its public names are re-exported by `quorumgate` itself; import them from there.
"""
