"""Helpers that tests import: assertions and bounded waits over what the package offers."""
