"""A prompt-injection benchmark of user tasks and injection tasks over four suites, run by
a scripted, fully compromised agent through the SDK on a live cluster (docs/injection.md)."""
