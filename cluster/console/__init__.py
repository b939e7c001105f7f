"""The principal's approvals console (docs/console.md): `app.py`, `command.py`."""
